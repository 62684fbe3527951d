//! What pinning writes (or wrote) on a node's runtime configuration against what is there, with the notes
//! shown above that diff: who holds the pins written, and what CRI-O will have in force once its drop-in is
//! written.

use std::collections::BTreeMap;

use super::crio::CrioConfig;
use super::diff::DiffKind;
use super::holders::{Holder, Holders};

/// What pinning writes (or wrote) on one node, against what is there; computed by the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigView {
    pub path: String,
    /// Shown above the diff: what is in force once written and which file it comes from (CRI-O's
    /// effective `pinned_images`).
    pub notes: Vec<ConfigNote>,
    pub lines: Vec<(DiffKind, String)>,
}

/// One line above a diff; a warning when the pins written would not be in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigNote {
    pub text: String,
    pub warning: bool,
}

impl ConfigNote {
    /// `held by: monitoring (2), upgrade-4.19 (3), unowned (1)`: who holds the pins the view writes, one
    /// count per holder over every pin. None when no one holds any.
    pub fn held<'h>(pins: impl IntoIterator<Item = &'h Holders>) -> Option<ConfigNote> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for holders in pins {
            for holder in holders {
                let name = match holder {
                    Holder::Set(name) => name.clone(),
                    Holder::Admin => "admin".into(),
                    Holder::Unowned => "unowned".into(),
                };
                *counts.entry(name).or_default() += 1;
            }
        }
        let held: Vec<String> = counts
            .iter()
            .map(|(name, n)| format!("{name} ({n})"))
            .collect();
        (!held.is_empty()).then(|| ConfigNote {
            text: format!("held by: {}", held.join(", ")),
            warning: false,
        })
    }

    /// CRI-O's effective `pinned_images` in `config` once `written` (the drop-in the diff shows) is
    /// written: which file it comes from and, when that is another file, its entries; a warning when it
    /// does not pin every one of `wanted`.
    pub fn in_force(config: &CrioConfig, written: &str, wanted: &[String]) -> Vec<ConfigNote> {
        /// Entries of another file shown; the rest are counted.
        const SHOWN: usize = 4;
        let Some(effective) = config.effective() else {
            return Vec::new();
        };
        let note = |text: String| ConfigNote {
            text,
            warning: false,
        };
        let patterns = &effective.patterns;
        let entries = match patterns.len() {
            1 => "1 entry".to_string(),
            n => format!("{n} entries"),
        };
        let mut notes = vec![note(format!(
            "in force: pinned_images from {} ({entries})",
            effective.file
        ))];
        if effective.file != written {
            notes.extend(patterns.iter().take(SHOWN).map(|p| note(format!("  {p}"))));
            if patterns.len() > SHOWN {
                notes.push(note(format!("  … {} more", patterns.len() - SHOWN)));
            }
        }
        let unpinned = wanted.iter().filter(|w| !config.pins(&[w])).count();
        if unpinned > 0 {
            notes.push(ConfigNote {
                text: format!(
                    "{} replaces pinned_images: {unpinned} of these images would not be pinned; add them \
                     there or remove its pinned_images",
                    effective.file
                ),
                warning: true,
            });
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_force_names_the_file_crio_takes_its_pins_from_and_warns_when_a_later_file_replaces_them()
    {
        let wanted = vec!["quay.io/a/app@sha256:1".to_string()];
        let files = |override_patterns: &str| {
            CrioConfig::read([
                (
                    "10-site.conf".into(),
                    "[crio.image]\npinned_images = [\"quay.io/base/*\"]\n".into(),
                ),
                (
                    "99-override.conf".into(),
                    format!("[crio.image]\npinned_images = [{override_patterns}]\n"),
                ),
            ])
            .unwrap()
            .with_drop_in("50-pinned-images", wanted.clone())
        };
        let notes = ConfigNote::in_force(
            &files(r#""registry.example.com/ns/*", "b", "c", "d", "e""#),
            "50-pinned-images",
            &wanted,
        );
        let texts: Vec<&str> = notes.iter().map(|n| n.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "in force: pinned_images from 99-override.conf (5 entries)",
                "  registry.example.com/ns/*",
                "  b",
                "  c",
                "  d",
                "  … 1 more",
                "99-override.conf replaces pinned_images: 1 of these images would not be pinned; add them \
                 there or remove its pinned_images",
            ]
        );
        assert!(notes.last().unwrap().warning && !notes[0].warning);
        let notes = ConfigNote::in_force(&files(r#""b""#), "50-pinned-images", &wanted);
        assert_eq!(
            notes[0].text,
            "in force: pinned_images from 99-override.conf (1 entry)"
        );
        // A glob of the later file that pins the images: in force, no warning.
        let notes = ConfigNote::in_force(&files(r#""quay.io/a/*""#), "50-pinned-images", &wanted);
        assert!(notes.iter().all(|n| !n.warning), "{notes:?}");
    }
}
