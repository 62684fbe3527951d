//! The sets a command names, read and checked before any node is touched: PinnedImageSet files, list files,
//! `--image` flags and releases (`--set`, `--images-file`, `--image`, `--release`). All problems of all sets
//! are reported together.

use std::path::{Path, PathBuf};

use crate::backend::registry::Registry;
use crate::error::{Exit, Failure};
use crate::model::image::Platform;
use crate::model::labels::{Selector, parse_selector};
use crate::model::readiness::UnknownSets;
use crate::model::release_payload::{ReleaseSets, SetOptions};
use crate::model::set::{self, ImageSet};

/// What the command line names as sets.
#[derive(Clone, Debug, Default)]
pub struct SetSources {
    /// `--set`: PinnedImageSet files, or the names of sets the fleet holds (`unpin`, cluster mode).
    pub sets: Vec<PathBuf>,
    /// `--images-file`.
    pub images_files: Vec<PathBuf>,
    /// `--image`.
    pub images: Vec<String>,
    /// `--release`.
    pub releases: Vec<String>,
    /// `--selector`: the nodes every set lands on, replacing the sets' own selectors.
    pub selector: Option<String>,
    /// How a release becomes sets.
    pub release: SetOptions,
}

impl SetSources {
    /// Whether nothing at all is named.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
            && self.images_files.is_empty()
            && self.images.is_empty()
            && self.releases.is_empty()
    }

    /// These sources with `--set` reduced to the values that are files; the others, as set names.
    pub fn split_names(&self) -> (SetSources, Vec<String>) {
        let (files, names): (Vec<PathBuf>, Vec<PathBuf>) =
            self.sets.iter().cloned().partition(|p| p.is_file());
        let names = names
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        (
            SetSources {
                sets: files,
                ..self.clone()
            },
            names,
        )
    }
}

/// Reads and checks every set of `sources` but the releases. `required`: whether giving no images at all
/// is an error.
pub fn read(sources: &SetSources, required: bool) -> Result<Vec<ImageSet>, Failure> {
    let mut sets = Vec::new();
    let mut problems = Vec::new();
    for path in &sources.sets {
        match set::parse_yaml(&read_file(path)?, &path.display().to_string()) {
            Ok(found) if found.is_empty() => {
                problems.push(format!("{}: holds no PinnedImageSet", path.display()))
            }
            Ok(found) => sets.extend(found),
            Err(found) => problems.extend(found.iter().map(ToString::to_string)),
        }
    }
    for path in &sources.images_files {
        sets.push(set::parse_list(
            &read_file(path)?,
            &path.display().to_string(),
        ));
    }
    if !sources.images.is_empty() {
        sets.push(set::from_image_flags(&sources.images));
    }
    if let Err(problem) = select(&mut sets, sources) {
        problems.push(problem);
    }
    if required && sets.is_empty() && problems.is_empty() && sources.releases.is_empty() {
        return Err(Failure::bad_input(
            "no images given: pass --set FILE, --images-file FILE, --image REF or --release PULLSPEC",
        ));
    }
    problems.extend(
        sets.iter()
            .flat_map(|s| s.validate())
            .map(|p| p.to_string()),
    );
    if problems.is_empty() {
        Ok(sets)
    } else {
        Err(Failure {
            exit: Exit::BadInput,
            lines: problems,
        })
    }
}

/// `--selector`, when given, as every set's node selector; the problem with it, when it has one.
fn select(sets: &mut [ImageSet], sources: &SetSources) -> Result<(), String> {
    let Some(text) = &sources.selector else {
        return Ok(());
    };
    let selector = parse_selector(text).map_err(|e| format!("--selector {text:?}: {e}"))?;
    for set in sets {
        set.node_selector = Some(Selector(selector.clone()));
    }
    Ok(())
}

/// Every set of `sources`: those [`read`] reads, then the releases' ([`releases`]). Also what to tell
/// about each release.
pub async fn resolve(
    sources: &SetSources,
    required: bool,
    registry: &Registry,
    platform: &Platform,
) -> Result<(Vec<ImageSet>, Vec<String>), Failure> {
    let mut sets = read(sources, required)?;
    let (mut releases, notes) = releases(sources, registry, platform).await?;
    select(&mut releases, sources).map_err(Failure::bad_input)?;
    sets.extend(releases);
    Ok((sets, notes))
}

/// [`resolve`], what to tell about each release said on stderr.
pub async fn noted(
    sources: &SetSources,
    required: bool,
    registry: &Registry,
    platform: &Platform,
) -> Result<Vec<ImageSet>, Failure> {
    let (sets, notes) = resolve(sources, required, registry, platform).await?;
    for note in notes {
        eprintln!("{note}");
    }
    Ok(sets)
}

/// Each `--release`'s sets, read from its payload through `registry` for `platform`, and what to tell
/// about it (its version, what was folded or left out, a split).
pub async fn releases(
    sources: &SetSources,
    registry: &Registry,
    platform: &Platform,
) -> Result<(Vec<ImageSet>, Vec<String>), Failure> {
    let (mut sets, mut notes) = (Vec::new(), Vec::new());
    for pullspec in &sources.releases {
        let (resolved, made) =
            crate::fleet::payload::sets(registry, pullspec, platform, &sources.release).await?;
        notes.push(release_note(&resolved, &made));
        sets.extend(made.sets);
    }
    Ok((sets, notes))
}

/// `release 4.19.3 (quay.io/…@sha256:…): 188 images in set release-4.19.3; 3 tags share a digest; 2
/// components excluded`.
pub fn release_note(resolved: &crate::fleet::payload::Resolved, made: &ReleaseSets) -> String {
    let images: usize = made.sets.iter().map(|s| s.entries.len()).sum();
    let names: Vec<&str> = made.sets.iter().map(|s| s.name.as_str()).collect();
    let mut note = format!(
        "release {} ({}): {images} images in {} {}",
        resolved.release.version,
        resolved.image,
        if names.len() == 1 { "set" } else { "sets" },
        names.join(", ")
    );
    if names.len() > 1 {
        note.push_str(&format!(
            " (a PinnedImageSet holds at most {})",
            set::MAX_ENTRIES
        ));
    }
    if let Some(mirror) = &resolved.mirror {
        note.push_str(&format!("; read through mirror {mirror}"));
    }
    if made.folded > 0 {
        note.push_str(&format!(
            "; {} tags share a digest with another",
            made.folded
        ));
    }
    if !made.excluded.is_empty() {
        let names: Vec<&str> = made.excluded.iter().map(|c| c.name.as_str()).collect();
        note.push_str(&format!("; excluded: {}", names.join(", ")));
    }
    note
}

/// The `--set` values of `sources` that are no file, as the names of sets whose pins the nodes hold
/// (direct-mode `unpin --set NAME`), and the sources without them. A value that is neither a file nor a
/// set name is a file that cannot be read.
pub fn take_names(sources: &SetSources) -> Result<(SetSources, Vec<String>), Failure> {
    let (files, names) = sources.split_names();
    let names = names
        .into_iter()
        .map(|name| match set::name_problem(&name) {
            None => Ok(name),
            Some(_) => Err(Failure::bad_input(format!(
                "cannot read {name}: no such file, and it is not a set name either"
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok((files, names))
}

fn read_file(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path)
        .map_err(|e| Failure::bad_input(format!("cannot read {}: {e}", path.display())))
}

/// `"a" is` / `"a", "b" are`.
/// Sets named that are neither files nor `kind`s on the cluster: bad input, naming those there and `file`
/// as the other way to give one.
pub(super) fn unknown_sets(sets: UnknownSets, kind: &str, file: &str) -> Failure {
    let there = match sets.there.is_empty() {
        true => "none".to_string(),
        false => sets.there.join(", "),
    };
    Failure::bad_input(format!(
        "{} neither a file nor a {kind} on the cluster (sets there: {there}); give a set's name or {file}",
        quoted_list(&sets.unknown)
    ))
}

pub(super) fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!(
        "{} {}",
        quoted.join(", "),
        if items.len() == 1 { "is" } else { "are" }
    )
}
