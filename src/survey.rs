//! A survey: ask every node and the registry about a set of images, at the same time, and plan each node.
//!
//! `pinboard plan` prints a survey; the TUI's Plan screen shows one. Both get their figures from
//! [`crate::model::plan::plan_node`] through [`survey`], so a number on screen and in `plan` cannot differ.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::StreamExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::backend::blobs;
use crate::backend::node::{SurveyedNode, survey_node};
use crate::backend::openshift::Cluster;
use crate::backend::pinboard_api::PinboardApi;
use crate::backend::registry::{PlatformFacts, Registry, RegistryError};
use crate::backend::target::DirectNode;
use crate::error::{Exit, Failure};
use crate::model::agents_view::{AgentsView, NodeWithSet};
use crate::model::image::{ImageFacts, Platform};
use crate::model::machine_config::{ClusterNode, ClusterView};
use crate::model::node_blobs::NodeBlobs;
use crate::model::pinboard_api::NodeImages;
use crate::model::plan::{
    Limits, LinkBytes, LinkCount, NodeFacts, NodePlan, PlannedImage, Presence, plan_node_counted,
};
use crate::model::readiness::unreachable_reason;
use crate::model::reference::{count_images, short_reference, some_of};
use crate::model::served::ServedDigests;
use crate::model::set::ImageSet;

/// Configs read at once for their layers' uncompressed digests.
const DIFF_IDS_AT_ONCE: usize = 16;
/// Image lists read at once, of the nodes whose agent publishes no holdings.
const IMAGE_LISTS_AT_ONCE: usize = 16;

/// The result of a survey, serialized as `plan -o json|yaml` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Survey {
    pub sets: Vec<SetSummary>,
    pub gc_high_percent: u8,
    pub min_free_bytes: u64,
    pub nodes: Vec<NodePlan>,
    /// Bytes over the registry link for these nodes, with fan-out and without.
    #[serde(default)]
    pub link_bytes: LinkBytes,
    /// Every image's facts for the nodes' platform: what the engine needs to show byte progress.
    #[serde(skip)]
    pub facts: HashMap<String, ImageFacts>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetSummary {
    pub name: String,
    pub images: usize,
}

/// Why a survey could not produce a plan.
#[derive(Debug)]
pub enum SurveyError {
    /// No node answered: each node's error, naming it, in order.
    NoTarget(Vec<String>),
    /// Some images could not be resolved in the registry: (reference, error), in set order.
    Images(Vec<(String, RegistryError)>),
}

impl From<SurveyError> for Failure {
    fn from(err: SurveyError) -> Failure {
        match err {
            SurveyError::NoTarget(errors) => Failure::unreachable(errors),
            SurveyError::Images(failed) => Failure {
                exit: Exit::BadInput,
                lines: problem_lines(failed),
            },
        }
    }
}

/// One line per distinct problem: images that failed alike (the same message but for the image) are said
/// once, the first image's message followed by how many failed so and the first few of them, e.g. a
/// registry that speaks plain HTTP, for each of its images: `cannot reach registry … for a@…: …; pass
/// --insecure-registry … (12 images: a@…, b@…, c@…, d@…, e@… and 7 more)`.
fn problem_lines(failed: Vec<(String, RegistryError)>) -> Vec<String> {
    // (the message with its image left out, the first message, every image that failed so)
    let mut alike: Vec<(String, String, Vec<String>)> = Vec::new();
    for (reference, err) in failed {
        let message = err.to_string();
        let image = err.reference().unwrap_or(&reference);
        let problem = message.replace(image, "\0");
        match alike.iter_mut().find(|(p, ..)| *p == problem) {
            Some((_, _, images)) => images.push(reference),
            None => alike.push((problem, message, vec![reference])),
        }
    }
    alike
        .into_iter()
        .map(|(_, message, images)| match images.len() {
            1 => message,
            n => {
                let short: Vec<String> = images.iter().map(|i| short_reference(i)).collect();
                format!("{message} ({}: {})", count_images(n), some_of(&short))
            }
        })
        .collect()
}

/// Every distinct reference of the sets, in first-seen order: a set's entries target the same nodes, so an
/// image in two sets is pulled (and counted) once.
pub fn union_of(sets: &[ImageSet]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    sets.iter()
        .flat_map(|s| s.references())
        .filter(|r| seen.insert(*r))
        .map(str::to_string)
        .collect()
}

/// Surveys `nodes` for the union of `sets`, every node resolved for `platform`; `cache` is the blob cache
/// whose contents fan-out would not fetch again (None: none).
pub async fn survey(
    nodes: &[DirectNode],
    sets: &[ImageSet],
    registry: &Registry,
    platform: &Platform,
    limits: Limits,
    timeout: Duration,
    cache: Option<&Path>,
) -> Result<Survey, SurveyError> {
    let references = union_of(sets);
    let platforms = [platform.clone()];
    let observing =
        futures::future::join_all(nodes.iter().map(|n| survey_node(n, &references, timeout)));
    let (observations, inspected): (Vec<SurveyedNode>, _) =
        tokio::join!(observing, registry.inspect_all(&references, &platforms));

    if observations.iter().all(|o| o.facts.unreachable.is_some()) {
        return Err(SurveyError::NoTarget(
            observations
                .into_iter()
                .filter_map(|o| {
                    Some(format!(
                        "{}: {}",
                        o.facts.name,
                        unreachable_reason(&o.facts.unreachable?)
                    ))
                })
                .collect(),
        ));
    }
    let mut facts = resolved(&references, inspected)?;
    let shared = Shared::default().of(&references);
    let planned: Vec<ToPlan> = observations
        .iter()
        .map(|o| ToPlan::of(o, &shared))
        .collect();
    read_diff_ids(registry, &mut facts, &planned).await;
    Ok(summarize(sets, limits, &planned, facts, cache))
}

/// One node to plan: what is known of it, the references of the sets it gets, and whether it holds
/// each.
struct ToPlan<'a> {
    facts: &'a NodeFacts,
    references: &'a [Arc<str>],
    presence: Vec<Presence>,
}

impl<'a> ToPlan<'a> {
    fn of(observed: &'a SurveyedNode, references: &'a [Arc<str>]) -> ToPlan<'a> {
        let presence = references
            .iter()
            .map(|r| observed.presence.get(&**r).copied().flatten())
            .collect();
        ToPlan {
            facts: &observed.facts,
            references,
            presence,
        }
    }
}

/// References shared by every node's plan: one copy of each however many nodes plan it.
#[derive(Default)]
struct Shared(HashMap<String, Arc<str>>);

impl Shared {
    fn of(&mut self, references: &[String]) -> Vec<Arc<str>> {
        references
            .iter()
            .map(|r| Arc::clone(self.0.entry(r.clone()).or_insert_with(|| r.as_str().into())))
            .collect()
    }
}

/// The layers' uncompressed digests of the images some node holding layers by them (CRI-O) lacks, read
/// from their configs, so its plan leaves out the layers it holds. An image whose config cannot be read
/// keeps none: that node's figure is then an upper bound, and says so.
async fn read_diff_ids(
    registry: &Registry,
    facts: &mut HashMap<String, ImageFacts>,
    nodes: &[ToPlan<'_>],
) {
    let lacking: BTreeSet<&Arc<str>> = nodes
        .iter()
        .filter(|n| n.facts.held.by_diff_id())
        .flat_map(|n| n.references.iter().zip(&n.presence))
        .filter(|(_, present)| **present != Some(true))
        .map(|(reference, _)| reference)
        .collect();
    // Owned: a stream of futures borrowing them is not Send-general enough for the fleet's boxed futures.
    let asked: Vec<(String, ImageFacts)> = lacking
        .into_iter()
        .filter_map(|reference| Some((reference.to_string(), facts.get(&**reference)?.clone())))
        .collect();
    let read: Vec<(String, Result<Vec<String>, RegistryError>)> =
        futures::stream::iter(asked.into_iter().map(|(reference, image)| async move {
            let ids = registry.diff_ids(&reference, &image).await;
            (reference, ids)
        }))
        .buffer_unordered(DIFF_IDS_AT_ONCE)
        .collect()
        .await;
    let mut failed = Vec::new();
    for (reference, diff_ids) in read {
        let Some(image) = facts.get_mut(&reference) else {
            continue;
        };
        match diff_ids {
            Ok(ids) if ids.len() == image.layers.len() => {
                for (layer, id) in image.layers.iter_mut().zip(ids) {
                    layer.diff_id = Some(id);
                }
            }
            Ok(ids) => tracing::warn!(
                "{reference}: its config lists {} layers, its manifest {}; its layers are counted as not held",
                ids.len(),
                image.layers.len()
            ),
            Err(e) => failed.push((reference, e)),
        }
    }
    for line in problem_lines(failed) {
        tracing::warn!(
            "{line}; its layers count as not held, so the plan of a node that holds layers by their \
             uncompressed digests (CRI-O) is an upper bound"
        );
    }
}

/// Each node planned for its own images, with the layers' uncompressed digests where a node holds layers
/// by them.
async fn plan_nodes(
    nodes: &[ToPlan<'_>],
    sets: &[ImageSet],
    registry: &Registry,
    mut facts: HashMap<String, ImageFacts>,
    limits: Limits,
    cache: Option<&Path>,
) -> Survey {
    read_diff_ids(registry, &mut facts, nodes).await;
    summarize(sets, limits, nodes, facts, cache)
}

/// Every image of the sets, resolved for `platform`, by reference; or every reference the registry could not
/// resolve.
pub async fn image_facts(
    sets: &[ImageSet],
    registry: &Registry,
    platform: &Platform,
) -> Result<HashMap<String, ImageFacts>, SurveyError> {
    let references = union_of(sets);
    let inspected = registry
        .inspect_all(&references, std::slice::from_ref(platform))
        .await;
    resolved(&references, inspected)
}

/// What a mirror of `sets` serves (`pinboard mirror`, the in-cluster cache): every image resolved for
/// `platform`, and the digests of their manifests and blobs.
pub async fn served_digests(
    sets: &[ImageSet],
    registry: &Registry,
    platform: &Platform,
) -> Result<(HashMap<String, ImageFacts>, ServedDigests), SurveyError> {
    let facts = image_facts(sets, registry, platform).await?;
    let allowed = ServedDigests::from_facts(facts.iter().map(|(r, f)| (r.as_str(), f)));
    Ok((facts, allowed))
}

/// Cluster mode: every node the sets land on (by their labels, as they would be applied), each planned for
/// the union of the sets that land on it, with what the cluster tells about its space
/// ([`Cluster::observe`]); a node whose pinboard agent `published` what its runtime holds is planned by
/// that, exactly, the others by their Node's image list (an upper bound).
#[allow(
    clippy::too_many_arguments,
    reason = "the survey's inputs, each its own"
)]
pub async fn survey_cluster(
    cluster: &Cluster,
    view: &ClusterView,
    mut published: BTreeMap<String, NodeBlobs>,
    sets: &[ImageSet],
    registry: &Registry,
    platform: &Platform,
    limits: Limits,
    cache: Option<&Path>,
) -> Result<Survey, SurveyError> {
    // Nodes of the same pools share one union of the same sets.
    let mut sets_of: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (index, set) in sets.iter().enumerate() {
        for node in view.nodes_of(&set.labels) {
            sets_of.entry(node).or_default().push(index);
        }
    }
    let mut unions: HashMap<Vec<usize>, Vec<String>> = HashMap::new();
    let per_node: BTreeMap<String, Vec<String>> = sets_of
        .into_iter()
        .map(|(node, indices)| {
            let union = unions.entry(indices).or_insert_with_key(|indices| {
                let chosen: Vec<ImageSet> = indices.iter().map(|&i| sets[i].clone()).collect();
                union_of(&chosen)
            });
            (node, union.clone())
        })
        .collect();
    if per_node.is_empty() {
        return Err(SurveyError::NoTarget(vec![
            "the sets land on no node: no MachineConfigPool selects their labels, or those pools have no nodes"
                .into(),
        ]));
    }
    let (known, missing): (Vec<_>, Vec<_>) = per_node
        .into_iter()
        .partition(|(name, _)| view.node(name).is_some());
    let asked: Vec<(&ClusterNode, Vec<String>)> = known
        .into_iter()
        .filter_map(|(name, references)| Some((view.node(&name)?, references)))
        .collect();
    let mut nodes: Vec<(SurveyedNode, Vec<String>)> = cluster
        .observe(&asked)
        .await
        .into_iter()
        .zip(asked.into_iter().map(|(_, references)| references))
        .collect();
    for (observed, references) in &mut nodes {
        if let Some(blobs) = published.remove(&observed.facts.name) {
            let presence = blobs.plan_facts(&mut observed.facts, references);
            observed.presence = references.iter().cloned().zip(presence).collect();
        }
    }
    nodes.extend(missing.into_iter().map(|(name, references)| {
        let facts = NodeFacts {
            unreachable: Some(format!(
                "no Node object {name:?}: only its MachineConfigNode exists"
            )),
            name,
            ..NodeFacts::default()
        };
        (
            SurveyedNode {
                facts,
                presence: HashMap::new(),
            },
            references,
        )
    }));
    nodes.sort_by(|a, b| a.0.facts.name.cmp(&b.0.facts.name));
    let facts = image_facts(sets, registry, platform).await?;
    let mut shared = Shared::default();
    let references: Vec<Vec<Arc<str>>> = nodes.iter().map(|(_, refs)| shared.of(refs)).collect();
    let planned: Vec<ToPlan> = nodes
        .iter()
        .zip(&references)
        .map(|((o, _), refs)| ToPlan::of(o, refs))
        .collect();
    Ok(plan_nodes(&planned, sets, registry, facts, limits, cache).await)
}

/// On agents: every node the sets are judged on ([`AgentsView::choose`]: those they select that an agents'
/// DaemonSet should run on or whose agent is alive), each planned for the union of the sets that select it,
/// from what its agent reported at `now` (its image filesystem, its kubelet's thresholds, what it pulls by)
/// and what it published of what its runtime holds ([`NodeBlobs`], read once for every node from the API
/// server's watch cache): exact. A node whose agent publishes nothing yet (an older agent) is planned by
/// its image list, read for it alone: an upper bound. A node whose agent is missing or stale is
/// unreachable, with why. Nothing is written.
#[allow(
    clippy::too_many_arguments,
    reason = "the survey's inputs, each its own"
)]
pub async fn survey_reported(
    api: &PinboardApi,
    view: &AgentsView,
    sets: &[ImageSet],
    registry: &Registry,
    platform: &Platform,
    limits: Limits,
    cache: Option<&Path>,
    now: SystemTime,
) -> Result<Survey, SurveyError> {
    let mut sets_of: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, set) in sets.iter().enumerate() {
        let selector = set.node_selector.as_ref().map(|s| &s.0);
        for node in view.choose(selector, now).judged {
            sets_of.entry(&node.name).or_default().push(index);
        }
    }
    if sets_of.is_empty() {
        return Err(SurveyError::NoTarget(vec![
            "the sets select no node an agent runs or should run on: check their nodeSelector (or \
             --selector) against `kubectl get nodes --show-labels`, and that the agents run \
             (docs/agents.md)"
                .into(),
        ]));
    }
    // Nodes the same sets select share one union of their references.
    let mut unions: Vec<Vec<Arc<str>>> = Vec::new();
    let mut shared = Shared::default();
    let mut union_of_sets: HashMap<Vec<usize>, usize> = HashMap::new();
    let nodes: Vec<(&str, usize)> = sets_of
        .into_iter()
        .map(|(name, indices)| {
            let union = *union_of_sets.entry(indices).or_insert_with_key(|indices| {
                let chosen: Vec<ImageSet> = indices.iter().map(|&i| sets[i].clone()).collect();
                unions.push(shared.of(&union_of(&chosen)));
                unions.len() - 1
            });
            (name, union)
        })
        .collect();
    let references = union_of(sets);
    let platforms = [platform.clone()];
    let (published, inspected) = tokio::join!(
        api.published_blobs(),
        registry.inspect_all(&references, &platforms)
    );
    let mut published = published.unwrap_or_else(|e| {
        tracing::warn!(
            "cannot list what the nodes' runtimes hold (PinboardNodeBlobs), so every node is planned by \
             its image list, an upper bound; the ClusterRole pinboard-agents-viewer reads them: {e}"
        );
        BTreeMap::new()
    });
    let facts = resolved(&references, inspected)?;
    let trusted = |name: &str| view.agent_untrusted(name, now).is_none();
    let older: Vec<String> = nodes
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| trusted(name) && !published.contains_key(*name))
        .map(str::to_owned)
        .collect();
    let image_lists = older_image_lists(api, older).await;
    let observed: Vec<(NodeFacts, Vec<Presence>, usize)> = nodes
        .iter()
        .map(|&(name, union)| {
            let references = &unions[union];
            let Some(report) = view.report(name).filter(|_| trusted(name)) else {
                let untrusted = view.agent_untrusted(name, now);
                let facts = NodeFacts {
                    name: name.to_owned(),
                    unreachable: Some(match untrusted {
                        Some(NodeWithSet::Stale { .. }) => {
                            "its agent's heartbeat is stale: what it reported is not trusted".into()
                        }
                        _ => "no pinboard agent reports on it yet".into(),
                    }),
                    ..NodeFacts::default()
                };
                return (facts, vec![None; references.len()], union);
            };
            let mut facts = report.facts(name);
            let presence = match published.remove(name) {
                Some(blobs) => blobs.plan_facts(&mut facts, references),
                None => {
                    let listed = image_lists.get(name);
                    references
                        .iter()
                        .map(|r| listed.map(|images| images.holds(r)))
                        .collect()
                }
            };
            (facts, presence, union)
        })
        .collect();
    let (known, presence): (Vec<(NodeFacts, usize)>, Vec<Vec<Presence>>) = observed
        .into_iter()
        .map(|(facts, presence, union)| ((facts, union), presence))
        .unzip();
    let planned: Vec<ToPlan> = known
        .iter()
        .zip(presence)
        .map(|((facts, union), presence)| ToPlan {
            facts,
            references: &unions[*union],
            presence,
        })
        .collect();
    Ok(plan_nodes(&planned, sets, registry, facts, limits, cache).await)
}

/// The image lists of nodes whose agent publishes no holdings (an older agent), each read on its own; a
/// list that cannot be read leaves its node's presence unknown.
async fn older_image_lists(api: &PinboardApi, nodes: Vec<String>) -> HashMap<String, NodeImages> {
    // Owned: a stream of futures borrowing them is not Send-general enough for the fleet's boxed futures.
    futures::stream::iter(nodes.into_iter().map(|name| async move {
        match api.node_images(&name).await {
            Ok(images) => images.map(|images| (name, images)),
            Err(e) => {
                tracing::warn!("{name}: cannot read its image list: {e}");
                None
            }
        }
    }))
    .buffer_unordered(IMAGE_LISTS_AT_ONCE)
    .filter_map(std::future::ready)
    .collect()
    .await
}

type Inspected = Vec<Result<PlatformFacts, RegistryError>>;

/// Each reference's facts for the one platform asked, or every reference the registry could not resolve.
fn resolved(
    references: &[String],
    inspected: Inspected,
) -> Result<HashMap<String, ImageFacts>, SurveyError> {
    let mut facts = HashMap::new();
    let mut failed = Vec::new();
    for (reference, result) in references.iter().zip(inspected) {
        match result {
            Ok(mut per_platform) => {
                // One platform was asked for, and the registry answers for each platform asked.
                let (_, image) = per_platform.swap_remove(0);
                facts.insert(reference.clone(), image);
            }
            Err(err) => failed.push((reference.clone(), err)),
        }
    }
    if failed.is_empty() {
        Ok(facts)
    } else {
        Err(SurveyError::Images(failed))
    }
}

/// Plans every node for its references and puts the survey together, with what the link carries for them
/// ([`LinkCount`], against what `cache` holds).
fn summarize(
    sets: &[ImageSet],
    limits: Limits,
    nodes: &[ToPlan<'_>],
    facts: HashMap<String, ImageFacts>,
    cache: Option<&Path>,
) -> Survey {
    let mut link = LinkCount::default();
    let nodes = nodes
        .iter()
        .map(|node| {
            let images: Vec<PlannedImage> = node
                .references
                .iter()
                .zip(&node.presence)
                .map(|(r, present)| PlannedImage {
                    reference: Arc::clone(r),
                    facts: &facts[&**r],
                    present: *present,
                    lazy: node.facts.lazy.get(&**r),
                })
                .collect();
            plan_node_counted(node.facts, &images, &limits, &mut link)
        })
        .collect();
    let link_bytes = link.total(|digest| cache.is_some_and(|dir| blobs::cache::holds(dir, digest)));
    Survey {
        sets: sets
            .iter()
            .map(|s| SetSummary {
                name: s.name.clone(),
                images: s.entries.len(),
            })
            .collect(),
        gc_high_percent: limits.gc_high_percent,
        min_free_bytes: limits.min_free_bytes,
        nodes,
        link_bytes,
        facts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::set::from_flags;

    #[test]
    fn images_that_fail_alike_are_one_line_with_their_count_and_the_first_few() {
        let registry = "r.example:5000";
        let image = |i: usize| format!("{registry}/shop/app{i}@sha256:{}", "ab".repeat(32));
        let plain_http = |i: usize| {
            let error = RegistryError::Unreachable {
                reference: image(i),
                registry: registry.into(),
                cause: format!(
                    "TLS handshake failed (corrupt message); the registry seems to speak plain HTTP: if that \
                     is intended, pass --insecure-registry {registry}"
                ),
            };
            (image(i), error)
        };
        let mut failed: Vec<_> = (0..12).map(plain_http).collect();
        let missing = RegistryError::NotFound {
            reference: image(99),
            registry: registry.into(),
        };
        failed.insert(3, (image(99), missing.clone()));
        let lines = Failure::from(SurveyError::Images(failed)).lines;
        assert_eq!(lines.len(), 2, "{lines:#?}");
        let short = |i: usize| format!("{registry}/shop/app{i}@sha256:abababababab…");
        assert_eq!(
            lines[0],
            format!(
                "{} (12 images: {}, {}, {}, {}, {} and 7 more)",
                plain_http(0).1,
                short(0),
                short(1),
                short(2),
                short(3),
                short(4)
            )
        );
        assert_eq!(
            lines[1],
            missing.to_string(),
            "a problem of one image, as it was"
        );
    }

    #[test]
    fn union_keeps_first_seen_order_without_duplicates() {
        let a = from_flags("a", &["x".into(), "y".into()]);
        let b = from_flags("b", &["y".into(), "z".into(), "x".into()]);
        assert_eq!(union_of(&[a, b]), ["x", "y", "z"]);
    }
}
