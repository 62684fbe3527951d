//! Who holds each pin in direct mode, so that unpinning one set keeps the pins another still needs. Pure:
//! the record on the node (CRI-O drop-in marks, containerd labels) is read and written by
//! [`crate::backend::pins`].
//!
//! A pin is held by the sets that pinned it ([`Holder::Set`]), by an administrator ([`Holder::Admin`]: an
//! entry pinboard did not mark, which it never removes), or by no one pinboard knows ([`Holder::Unowned`]:
//! a pin from before pinboard recorded holders, or a containerd pin label someone else set, which only
//! `--release-unowned` removes). A pin stays while any holder remains ([`ReleaseScope`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::crio::{CrioConfig, Pattern};
use super::set::ImageSet;

/// One holder of a pin.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    /// A set pinboard pinned it for.
    Set(String),
    /// An administrator's own entry: pinboard never removes it.
    Admin,
    /// Pinned before pinboard recorded holders, or by someone else: removed only with `--release-unowned`.
    Unowned,
}

pub type Holders = BTreeSet<Holder>;

/// The sets of `sets` that list each image: who holds its pin once they are applied.
pub fn holders_of(sets: &[ImageSet]) -> BTreeMap<String, BTreeSet<String>> {
    let mut holders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for set in sets {
        for reference in set.references() {
            holders
                .entry(reference.to_string())
                .or_default()
                .insert(set.name.clone());
        }
    }
    holders
}

/// One `pinned_images` entry of pinboard's CRI-O drop-in and who holds it: `{Admin}` for an entry without
/// pinboard's mark (in a drop-in written since pinboard marks its entries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrioEntry {
    pub pattern: String,
    pub holders: Holders,
}

/// Who holds the pin of an image known by `names` on CRI-O: every entry of pinboard's drop-in (named
/// `drop_in` in `config`) that matches one of its names, and an administrator when another file's
/// `pinned_images` is in force and pins it.
pub fn crio_holders<S: AsRef<str>>(
    entries: &[CrioEntry],
    config: &CrioConfig,
    drop_in: &str,
    names: &[S],
) -> Holders {
    let mut holders: Holders = entries
        .iter()
        .filter(|e| {
            let pattern = Pattern::parse(&e.pattern);
            names.iter().any(|n| pattern.matches(n.as_ref()))
        })
        .flat_map(|e| e.holders.iter().cloned())
        .collect();
    if config.effective().is_some_and(|s| s.file != drop_in) && config.pins(names) {
        holders.insert(Holder::Admin);
    }
    holders
}

/// `set-b and set-c`, `the administrator`, `set-b and an unowned pin`: who keeps a pin, in a sentence.
pub fn words(holders: &Holders) -> String {
    let names: Vec<String> = holders
        .iter()
        .map(|h| match h {
            Holder::Set(name) => name.clone(),
            Holder::Admin => "the administrator's entry".into(),
            Holder::Unowned => "an unowned pin (--release-unowned removes it)".into(),
        })
        .collect();
    match names.as_slice() {
        [] => "no one".into(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Who holds a pin, as `status` and `check` print it (`heldBy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldBy {
    /// The sets pinboard pinned it for.
    pub sets: Vec<String>,
    /// An administrator's own entry pins it (CRI-O: an entry without pinboard's mark, or another file).
    pub admin: bool,
    /// Pinned before pinboard recorded holders, or by someone else.
    pub unowned: bool,
}

impl From<&Holders> for HeldBy {
    fn from(holders: &Holders) -> HeldBy {
        HeldBy {
            sets: holders
                .iter()
                .filter_map(|h| match h {
                    Holder::Set(name) => Some(name.clone()),
                    _ => None,
                })
                .collect(),
            admin: holders.contains(&Holder::Admin),
            unowned: holders.contains(&Holder::Unowned),
        }
    }
}

impl HeldBy {
    /// `set-a, set-b, admin`; `-` when no one holds it.
    pub fn short(&self) -> String {
        let mut names = self.sets.clone();
        names.extend(self.admin.then(|| "admin".to_string()));
        names.extend(self.unowned.then(|| "unowned".to_string()));
        if names.is_empty() {
            "-".into()
        } else {
            names.join(", ")
        }
    }
}

/// Which sets an unpin releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sets {
    Named(BTreeSet<String>),
    /// `--all-sets`: every set pinboard pinned for.
    All,
}

/// What an unpin releases on each node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseScope {
    pub sets: Sets,
    /// When given, only the pins these images name lose the sets' holds (a set that no longer lists them);
    /// every other pin keeps them.
    pub only: Option<BTreeSet<String>>,
    /// The images the command's sets list: reported on even when another holder keeps them, and, with
    /// `release_unowned`, released from their unowned holder.
    pub images: BTreeSet<String>,
    pub release_unowned: bool,
}

impl ReleaseScope {
    /// Releases the holds of the sets named `sets`; reports on `images`, and with `release_unowned`
    /// releases their unowned pins.
    pub fn of_sets<S: AsRef<str>>(sets: &[S], images: &[S], release_unowned: bool) -> ReleaseScope {
        let strings = |list: &[S]| list.iter().map(|s| s.as_ref().to_string()).collect();
        ReleaseScope {
            sets: Sets::Named(strings(sets)),
            only: None,
            images: strings(images),
            release_unowned,
        }
    }

    /// Releases set `set`'s hold on the pins of `images` only: what an edited set no longer lists.
    pub fn of_images<S: AsRef<str>>(set: &str, images: &[S]) -> ReleaseScope {
        let images: BTreeSet<String> = images.iter().map(|s| s.as_ref().to_string()).collect();
        ReleaseScope {
            sets: Sets::Named([set.to_string()].into()),
            only: Some(images.clone()),
            images,
            release_unowned: false,
        }
    }

    /// The holders a pin known by `names` keeps (an administrator's entry always stays).
    pub fn after(&self, holders: &Holders, names: &[String]) -> Holders {
        holders
            .iter()
            .filter(|h| match h {
                Holder::Set(_) if self.only.is_some() && !self.names_any(names) => true,
                Holder::Set(name) => match &self.sets {
                    Sets::Named(released) => !released.contains(name),
                    Sets::All => false,
                },
                Holder::Admin => true,
                Holder::Unowned => !(self.release_unowned && self.names_any(names)),
            })
            .cloned()
            .collect()
    }

    /// Whether a pin known by `names` (image names, or CRI-O patterns) is one of the command's images.
    pub fn names_any(&self, names: &[String]) -> bool {
        names.iter().any(|name| {
            let pattern = Pattern::parse(name);
            self.images.iter().any(|image| pattern.matches(image))
        })
    }

    /// What releasing does to one pin; None when the unpin neither changes it nor was asked about it.
    pub fn change(&self, pin: &str, holders: &Holders, names: &[String]) -> Option<PinChange> {
        let after = self.after(holders, names);
        (after != *holders || (!holders.is_empty() && self.names_any(names))).then(|| PinChange {
            pin: pin.to_string(),
            before: holders.clone(),
            after,
        })
    }
}

/// One pin an unpin released a holder of, or was asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinChange {
    /// The image (containerd) or the drop-in entry (CRI-O).
    pub pin: String,
    pub before: Holders,
    pub after: Holders,
}

impl PinChange {
    /// No holder is left: the pin is gone.
    pub fn removed(&self) -> bool {
        self.after.is_empty()
    }
}

/// What unpinning did on one node, as `unpin` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnpinReport {
    /// Images (or CRI-O entries) that lost their pin.
    pub unpinned: Vec<String>,
    /// Those that stay pinned, and for whom.
    pub kept: Vec<KeptPin>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptPin {
    #[serde(rename = "ref")]
    pub reference: String,
    pub held_by: HeldBy,
    /// `stays pinned for set-b`.
    #[serde(skip)]
    pub words: String,
}

impl UnpinReport {
    pub fn of(changes: &[PinChange]) -> UnpinReport {
        let (removed, kept): (Vec<&PinChange>, Vec<&PinChange>) =
            changes.iter().partition(|c| c.removed());
        UnpinReport {
            unpinned: removed.iter().map(|c| c.pin.clone()).collect(),
            kept: kept
                .iter()
                .map(|c| KeptPin {
                    reference: c.pin.clone(),
                    held_by: HeldBy::from(&c.after),
                    words: format!("stays pinned for {}", words(&c.after)),
                })
                .collect(),
        }
    }

    /// `unpinned 3 images; y stays pinned for set-b`, with `short` shortening references: short enough
    /// for one line when it is the same on several nodes.
    pub fn sentence(&self, short: impl Fn(&str) -> String) -> String {
        let mut parts = Vec::new();
        match self.unpinned.as_slice() {
            [] => {}
            [one] => parts.push(format!("unpinned {}", short(one))),
            many => parts.push(format!("unpinned {} images", many.len())),
        }
        parts.extend(
            self.kept
                .iter()
                .map(|k| format!("{} {}", short(&k.reference), k.words)),
        );
        if parts.is_empty() {
            "nothing held by these sets".into()
        } else {
            parts.join("; ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::set::from_flags;

    fn holders(list: &[Holder]) -> Holders {
        list.iter().cloned().collect()
    }

    fn set(name: &str) -> Holder {
        Holder::Set(name.into())
    }

    #[test]
    fn an_edited_set_loses_its_hold_only_on_the_images_it_no_longer_lists() {
        let release = ReleaseScope::of_images("web", &["quay.io/a@sha256:1"]);
        let held = holders(&[set("web"), set("db")]);
        let dropped = ["quay.io/a@sha256:1".to_string()];
        let kept = ["quay.io/b@sha256:2".to_string()];
        assert_eq!(release.after(&held, &dropped), holders(&[set("db")]));
        assert_eq!(
            release.after(&held, &kept),
            held,
            "still listed: still held"
        );
    }

    #[test]
    fn each_image_is_held_by_the_sets_that_list_it() {
        let a = from_flags("a", &["x".into(), "y".into()]);
        let b = from_flags("b", &["y".into(), "z".into()]);
        let held = holders_of(&[a, b]);
        let names = |image: &str| held[image].iter().cloned().collect::<Vec<_>>();
        assert_eq!(names("x"), ["a"]);
        assert_eq!(names("y"), ["a", "b"]);
        assert_eq!(names("z"), ["b"]);
    }

    #[test]
    fn a_pin_stays_while_another_set_holds_it() {
        let y = ["y".to_string()];
        let by_both = holders(&[set("a"), set("b")]);
        let unpin_a = ReleaseScope::of_sets(&["a"], &["x", "y"], false);
        let change = unpin_a.change("y", &by_both, &y).unwrap();
        assert!(!change.removed());
        assert_eq!(change.after, holders(&[set("b")]));
        let unpin_b = ReleaseScope::of_sets(&["b"], &["y", "z"], false);
        assert!(unpin_b.change("y", &change.after, &y).unwrap().removed());
    }

    #[test]
    fn admin_entries_always_stay_and_unowned_ones_only_go_when_asked_for_their_image() {
        let x = ["x".to_string()];
        let admin = holders(&[Holder::Admin, set("a")]);
        let all = ReleaseScope {
            sets: Sets::All,
            only: None,
            images: BTreeSet::new(),
            release_unowned: true,
        };
        assert_eq!(all.after(&admin, &x), holders(&[Holder::Admin]));
        let unowned = holders(&[Holder::Unowned]);
        assert_eq!(
            all.after(&unowned, &x),
            unowned,
            "--release-unowned only releases the images the sets name"
        );
        assert_eq!(
            ReleaseScope::of_sets(&["a"], &["x"], false).after(&unowned, &x),
            unowned
        );
        assert!(
            ReleaseScope::of_sets(&["a"], &["x"], true)
                .after(&unowned, &x)
                .is_empty()
        );
        // A CRI-O pattern entry is one of the images when it matches it.
        let glob = ["quay.io/app/*".to_string()];
        assert!(ReleaseScope::of_sets(&[], &["quay.io/app/x@sha256:1"], false).names_any(&glob));
    }

    #[test]
    fn an_unpin_reports_what_it_changed_and_what_it_was_asked_about() {
        let unpin_a = ReleaseScope::of_sets(&["a"], &["x"], false);
        // Not held by a and not one of its images: not reported.
        assert_eq!(
            unpin_a.change("w", &holders(&[set("b")]), &["w".into()]),
            None
        );
        // One of a's images, held only by an administrator: reported as kept, for whom.
        let kept = unpin_a
            .change("x", &holders(&[Holder::Admin]), &["x".into()])
            .unwrap();
        let removed = unpin_a
            .change("v", &holders(&[set("a")]), &["v".into()])
            .unwrap();
        let also = unpin_a
            .change("w", &holders(&[set("a")]), &["w".into()])
            .unwrap();
        let shared = unpin_a
            .change("y", &holders(&[set("a"), set("b")]), &["y".into()])
            .unwrap();
        assert_eq!(
            UnpinReport::of(&[removed.clone(), also, shared]).sentence(|r| r.to_string()),
            "unpinned 2 images; y stays pinned for b"
        );
        let report = UnpinReport::of(&[kept, removed]);
        assert_eq!(report.unpinned, ["v"]);
        assert_eq!(report.kept[0].held_by.short(), "admin");
        assert_eq!(
            report.sentence(|r| r.to_string()),
            "unpinned v; x stays pinned for the administrator's entry"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["kept"][0]["heldBy"],
            serde_json::json!({"sets": [], "admin": true, "unowned": false})
        );
    }

    #[test]
    fn on_crio_the_matching_entries_hold_and_another_file_in_force_is_the_administrators() {
        use crate::model::crio::PinnedImagesSetting;
        let entries = [
            CrioEntry {
                pattern: "quay.io/app@sha256:1".into(),
                holders: holders(&[set("a"), set("b")]),
            },
            CrioEntry {
                pattern: "quay.io/*".into(),
                holders: holders(&[Holder::Admin]),
            },
            CrioEntry {
                pattern: "quay.io/app@sha256:1".into(),
                holders: holders(&[Holder::Unowned]),
            },
        ];
        let setting = |file: &str, patterns: &[&str]| PinnedImagesSetting {
            file: file.into(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
        };
        let ours = CrioConfig {
            settings: vec![setting("50-pinned-images", &["quay.io/app@sha256:1"])],
        };
        let names = ["quay.io/app@sha256:1"];
        assert_eq!(
            crio_holders(&entries, &ours, "50-pinned-images", &names),
            holders(&[set("a"), set("b"), Holder::Admin, Holder::Unowned])
        );
        assert_eq!(
            crio_holders(&entries, &ours, "50-pinned-images", &["ghcr.io/x@sha256:2"]),
            Holders::new()
        );
        let overridden = CrioConfig {
            settings: vec![setting("99-site.conf", &["ghcr.io/*"])],
        };
        assert_eq!(
            crio_holders(
                &[],
                &overridden,
                "50-pinned-images",
                &["ghcr.io/x@sha256:2"]
            ),
            holders(&[Holder::Admin])
        );
    }

    #[test]
    fn holders_read_as_a_sentence() {
        assert_eq!(words(&holders(&[set("b"), set("c")])), "b and c");
        assert_eq!(
            words(&holders(&[set("b"), Holder::Unowned])),
            "b and an unowned pin (--release-unowned removes it)"
        );
        assert_eq!(
            HeldBy::from(&holders(&[set("b"), Holder::Admin])).short(),
            "b, admin"
        );
    }
}
