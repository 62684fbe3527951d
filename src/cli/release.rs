//! `pinboard release PULLSPEC`: the PinnedImageSets that pre-load and pin an OpenShift upgrade — every unique
//! component of the release payload plus the release image itself, by digest — as YAML (the default, ready
//! for `oc apply -f` or `--set`), JSON, or a table with each image's compressed size. The payload's last
//! layer is read as it streams in; nothing else of it is downloaded. In cluster mode it is read with the
//! cluster's global pull secret, as for `plan`.

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;

use super::output::table;
use crate::error::Failure;
use crate::fleet::payload::{Resolved, sets};
use crate::fleet::sets::release_note;
use crate::model::export::{SetKind, document, set_yaml};
use crate::model::release_payload::ReleaseSets;
use crate::model::units::human;
use crate::options::{CommonArgs, Output};

#[derive(Args, Debug)]
pub struct ReleaseCommand {
    /// The release image, by tag or digest, e.g. quay.io/openshift-release-dev/ocp-release:4.19.3-x86_64.
    #[arg(value_name = "PULLSPEC")]
    pub pullspec: String,
    /// What to write the sets as: OpenShift's PinnedImageSet, or pinboard's PinSet for its agents on any
    /// Kubernetes cluster.
    #[arg(long, value_enum, default_value = "pinned-image-set")]
    pub kind: SetKind,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Several sets print as a `List`, which `oc apply -f` takes like a single object.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<T> {
    api_version: &'static str,
    kind: &'static str,
    items: Vec<T>,
}

pub async fn run(args: ReleaseCommand) -> Result<String, Failure> {
    let common = &args.common;
    // In cluster mode the payload is read with the cluster's pull secret, as its nodes will pull it.
    let registry = common.reading_registry().await?;
    let platform = common.targets.platform()?;
    let options = common.input.release.set_options();
    let (resolved, made) = sets(&registry, &args.pullspec, &platform, &options).await?;
    eprintln!("{}", release_note(&resolved, &made));
    let problems: Vec<String> = made
        .sets
        .iter()
        .flat_map(|s| s.validate())
        .map(|p| p.to_string())
        .collect();
    if !problems.is_empty() {
        return Err(Failure {
            exit: crate::error::Exit::BadInput,
            lines: problems,
        });
    }
    match common.output.unwrap_or(Output::Yaml) {
        Output::Yaml => Ok(made
            .sets
            .iter()
            .map(|set| set_yaml(set, args.kind))
            .collect::<Vec<_>>()
            .join("---\n")),
        Output::Json => {
            let documents: Vec<_> = made.sets.iter().map(|s| document(s, args.kind)).collect();
            let json = match documents.len() {
                1 => serde_json::to_string_pretty(&documents[0]),
                _ => serde_json::to_string_pretty(&List {
                    api_version: "v1",
                    kind: "List",
                    items: documents,
                }),
            };
            json.map(|j| j + "\n")
                .map_err(|e| Failure::bad_input(format!("cannot write JSON: {e}")))
        }
        Output::Table => {
            let sizes = compressed_sizes(&registry, &made, &platform).await?;
            Ok(components_table(&resolved, &made, &sizes))
        }
    }
}

/// Each image's compressed size (layers and config) for the nodes' platform.
async fn compressed_sizes(
    registry: &crate::backend::registry::Registry,
    made: &ReleaseSets,
    platform: &crate::model::image::Platform,
) -> Result<BTreeMap<String, u64>, Failure> {
    let references: Vec<&str> = made.sets.iter().flat_map(|s| s.references()).collect();
    let inspected = registry
        .inspect_all(&references, std::slice::from_ref(platform))
        .await;
    let mut sizes = BTreeMap::new();
    let mut failed = Vec::new();
    for (reference, result) in references.iter().zip(inspected) {
        match result {
            Ok(mut facts) => {
                let (_, facts) = facts.swap_remove(0);
                sizes.insert(
                    reference.to_string(),
                    facts.compressed_layer_bytes() + facts.config_size,
                );
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    if failed.is_empty() {
        Ok(sizes)
    } else {
        Err(Failure {
            exit: crate::error::Exit::BadInput,
            lines: failed,
        })
    }
}

/// One row per image: the components that name it (several tags may share a digest), its pull spec and
/// compressed size; then the set(s) and the total.
fn components_table(
    resolved: &Resolved,
    made: &ReleaseSets,
    sizes: &BTreeMap<String, u64>,
) -> String {
    let mut names: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for component in &resolved.release.components {
        names
            .entry(component.pullspec.as_str())
            .or_default()
            .push(&component.name);
    }
    let rows: Vec<Vec<String>> = made
        .sets
        .iter()
        .flat_map(|set| set.references().map(move |r| (set, r)))
        .map(|(set, reference)| {
            let component = match names.get(reference) {
                Some(names) => names.join(", "),
                None => "(release image)".into(),
            };
            vec![
                component,
                reference.to_owned(),
                sizes
                    .get(reference)
                    .map_or_else(|| "-".into(), |s| human(*s)),
                set.name.clone(),
            ]
        })
        .collect();
    let headers = ["COMPONENT", "PULL SPEC", "COMPRESSED", "SET"].map(String::from);
    let mut out = table(&headers, &rows, &|_, _, text| text.to_string());
    out.push_str(&format!(
        "\n{} images, {} compressed\n",
        rows.len(),
        human(sizes.values().sum())
    ));
    out
}
