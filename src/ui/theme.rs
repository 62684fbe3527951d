//! Themes: the files in themes/, compiled in. `NO_COLOR` (any value) selects monochrome.

use std::collections::HashMap;

use ratatui::style::Color;

use crate::model::plan::Verdict;

const THEMES: [(&str, &str); 3] = [
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    ("monochrome", include_str!("../../themes/monochrome.toml")),
];

#[derive(Clone, Debug, PartialEq)]
pub struct Theme {
    pub name: String,
    status: HashMap<String, Color>,
}

impl Theme {
    /// A built-in theme by name.
    pub fn named(name: &str) -> Result<Theme, String> {
        let (_, text) = THEMES.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            let names: Vec<&str> = THEMES.iter().map(|(n, _)| *n).collect();
            format!("no theme {name:?}: choose one of {}", names.join(", "))
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

    pub fn parse(text: &str) -> Result<Theme, String> {
        let doc: toml_edit::DocumentMut = text
            .parse()
            .map_err(|e| format!("theme is not valid TOML: {e}"))?;
        let name = doc
            .get("name")
            .and_then(|v| v.as_str())
            .ok_or("theme has no name")?
            .to_string();
        let table = doc
            .get("status")
            .and_then(|v| v.as_table())
            .ok_or("theme has no [status] table")?;
        let mut status = HashMap::new();
        for (key, value) in table.iter() {
            let text = value
                .as_str()
                .ok_or_else(|| format!("theme {name}: status.{key} is not a string"))?;
            let color = text
                .parse()
                .map_err(|_| format!("theme {name}: status.{key} = {text:?} is not a color"))?;
            status.insert(key.to_string(), color);
        }
        for verdict in [
            Verdict::Fits,
            Verdict::Tight,
            Verdict::NoSpace,
            Verdict::Unknown,
        ] {
            if !status.contains_key(verdict.as_str()) {
                return Err(format!(
                    "theme {name}: status.{} is missing",
                    verdict.as_str()
                ));
            }
        }
        Ok(Theme { name, status })
    }

    pub fn verdict(&self, verdict: Verdict) -> Color {
        self.status[verdict.as_str()]
    }

    pub fn is_monochrome(&self) -> bool {
        self.status.values().all(|c| *c == Color::Reset)
    }
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
                .contains("dark, light, monochrome")
        );
    }

    #[test]
    fn broken_themes_say_what_is_wrong() {
        assert!(
            Theme::parse("name = \"x\"\n[status]\nfits = \"chartreuse-ish\"\n")
                .unwrap_err()
                .contains("not a color")
        );
        assert!(
            Theme::parse("name = \"x\"\n[status]\nfits = \"red\"\n")
                .unwrap_err()
                .contains("status.tight is missing")
        );
    }
}
