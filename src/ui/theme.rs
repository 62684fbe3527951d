//! Themes: the files in themes/, compiled in. `NO_COLOR` (any value) selects monochrome.

use std::collections::HashMap;

use ratatui::style::Color;

use crate::error::Failure;
use crate::model::plan::Verdict;
use crate::ui::status::Tone;

/// Keys every theme's `[ui]` table must have.
const UI_KEYS: [&str; 4] = ["accent", "dim", "added", "removed"];

/// Colors for the screens' furniture, from a theme's `[ui]` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Titles, the current tab, key names.
    Accent,
    /// Secondary text.
    Dim,
    /// Diff lines added / removed.
    Added,
    Removed,
}

impl Role {
    fn key(self) -> &'static str {
        match self {
            Role::Accent => "accent",
            Role::Dim => "dim",
            Role::Added => "added",
            Role::Removed => "removed",
        }
    }
}

const THEMES: [(&str, &str); 3] = [
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    ("monochrome", include_str!("../../themes/monochrome.toml")),
];

/// Why a theme cannot be used: no such built-in theme, or what is wrong in its file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ThemeError {
    #[error("no theme {name:?}: choose one of {}", theme_names())]
    Unknown { name: String },
    #[error("theme is not valid TOML: {0}")]
    NotToml(toml_edit::TomlError),
    #[error("theme has no name")]
    NoName,
    #[error("theme {theme} has no [{table}] table")]
    NoTable { theme: String, table: String },
    #[error("theme {theme}: {table}.{key} is not a string")]
    NotAString {
        theme: String,
        table: String,
        key: String,
    },
    #[error("theme {theme}: {table}.{key} = {text:?} is not a color")]
    NotAColor {
        theme: String,
        table: String,
        key: String,
        text: String,
    },
    #[error("theme {theme}: {table}.{key} is missing")]
    Missing {
        theme: String,
        table: String,
        key: String,
    },
}

impl From<ThemeError> for Failure {
    fn from(error: ThemeError) -> Failure {
        Failure::bad_input(error.to_string())
    }
}

/// The built-in themes' names, for the message naming them.
fn theme_names() -> String {
    let names: Vec<&str> = THEMES.iter().map(|(n, _)| *n).collect();
    names.join(", ")
}

#[derive(Clone, Debug, PartialEq)]
pub struct Theme {
    pub name: String,
    status: HashMap<String, Color>,
    ui: HashMap<String, Color>,
}

impl Theme {
    /// A built-in theme by name.
    pub fn named(name: &str) -> Result<Theme, ThemeError> {
        let (_, text) =
            THEMES
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ThemeError::Unknown {
                    name: name.to_owned(),
                })?;
        Theme::parse(text)
    }

    /// The theme to use: monochrome under NO_COLOR, else dark.
    pub fn from_env() -> Theme {
        let name = if std::env::var_os("NO_COLOR").is_some() {
            "monochrome"
        } else {
            "dark"
        };
        Theme::named(name).expect("built-in themes parse")
    }

    pub fn parse(text: &str) -> Result<Theme, ThemeError> {
        let doc: toml_edit::DocumentMut = text.parse().map_err(ThemeError::NotToml)?;
        let name = doc
            .get("name")
            .and_then(|v| v.as_str())
            .ok_or(ThemeError::NoName)?
            .to_string();
        let status = colors(&doc, &name, "status")?;
        let ui = colors(&doc, &name, "ui")?;
        let verdicts = [
            Verdict::Fits,
            Verdict::Tight,
            Verdict::NoSpace,
            Verdict::Unknown,
        ]
        .map(Verdict::as_str);
        let tones = Tone::ALL.map(Tone::key);
        for (table, keys, have) in [
            ("status", &verdicts[..], &status),
            ("status", &tones[..], &status),
            ("ui", &UI_KEYS[..], &ui),
        ] {
            if let Some(key) = keys.iter().find(|k| !have.contains_key(**k)) {
                return Err(ThemeError::Missing {
                    theme: name,
                    table: table.to_owned(),
                    key: key.to_string(),
                });
            }
        }
        Ok(Theme { name, status, ui })
    }

    pub fn verdict(&self, verdict: Verdict) -> Color {
        self.status[verdict.as_str()]
    }

    pub fn tone(&self, tone: Tone) -> Color {
        self.status[tone.key()]
    }

    pub fn role(&self, role: Role) -> Color {
        self.ui[role.key()]
    }

    pub fn is_monochrome(&self) -> bool {
        self.status
            .values()
            .chain(self.ui.values())
            .all(|c| *c == Color::Reset)
    }
}

/// A table of `key = "color"` pairs.
fn colors(
    doc: &toml_edit::DocumentMut,
    name: &str,
    table: &str,
) -> Result<HashMap<String, Color>, ThemeError> {
    let items = doc
        .get(table)
        .and_then(|v| v.as_table())
        .ok_or_else(|| ThemeError::NoTable {
            theme: name.to_owned(),
            table: table.to_owned(),
        })?;
    items
        .iter()
        .map(|(key, value)| {
            let text = value.as_str().ok_or_else(|| ThemeError::NotAString {
                theme: name.to_owned(),
                table: table.to_owned(),
                key: key.to_owned(),
            })?;
            let color = text.parse().map_err(|_| ThemeError::NotAColor {
                theme: name.to_owned(),
                table: table.to_owned(),
                key: key.to_owned(),
                text: text.to_owned(),
            })?;
            Ok((key.to_string(), color))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_themes_parse_and_cover_every_verdict() {
        for (name, _) in THEMES {
            let theme = Theme::named(name).unwrap();
            assert_eq!(theme.name, name);
            assert_eq!(theme.is_monochrome(), name == "monochrome");
        }
        assert_eq!(
            Theme::named("dark").unwrap().verdict(Verdict::NoSpace),
            Color::LightRed
        );
        assert!(
            Theme::named("neon")
                .unwrap_err()
                .to_string()
                .contains("dark, light, monochrome")
        );
    }

    #[test]
    fn broken_themes_say_what_is_wrong() {
        assert!(
            Theme::parse("name = \"x\"\n[status]\nfits = \"chartreuse-ish\"\n")
                .unwrap_err()
                .to_string()
                .contains("not a color")
        );
        assert!(
            Theme::parse("name = \"x\"\n[ui]\n[status]\nfits = \"red\"\n")
                .unwrap_err()
                .to_string()
                .contains("status.tight is missing")
        );
    }
}
