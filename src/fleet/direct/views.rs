//! What the TUI shows of direct nodes, read from the nodes themselves: each node's runtime, space, images,
//! pins and lazy pulling as its runtime has it (the Nodes screen, whose lazy pulling is watched), and per
//! node what pinning a set writes against what is there (the Config screen: the CRI-O drop-in, or the
//! containerd labels, each pin with who holds it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use crate::backend::cri::CriClient;
use crate::backend::lazy::{read_lazy, runtime_kind};
use crate::backend::node::survey_node;
use crate::backend::pins::{self, CONTAINERD_PIN_VALUE, PinTarget, connect_resolved};
use crate::backend::target::NodeTarget;
use crate::model::config_view::{ConfigNote, ConfigView};
use crate::model::diff::DiffKind;
use crate::model::holders::{HeldBy, Holder, holders_of};
use crate::model::lazy::LazyPulling;
use crate::model::node_summary::NodeSummary;
use crate::model::rollout::PinMethod;
use crate::model::runtime::Runtime;
use crate::model::set::ImageSet;

/// Per node, what pinning the images of `sets` (each held by the sets that list it) writes there against
/// what is there now.
pub async fn config_views(
    targets: &[NodeTarget],
    sets: &[ImageSet],
    timeout: Duration,
) -> BTreeMap<String, ConfigView> {
    let holds = holders_of(sets);
    let views = targets.iter().map(|t| async {
        let view = match connect_resolved(&t.node.endpoint, t.pin.clone(), timeout).await {
            Ok((_, PinTarget::CrioDropIn { config_dir, .. })) => crio_view(&config_dir, &holds),
            Ok((client, _)) => containerd_view(&client, &holds).await,
            Err(e) => ConfigView {
                path: format!("pin method unknown: {e}"),
                notes: Vec::new(),
                lines: Vec::new(),
            },
        };
        (t.node.name.clone(), view)
    });
    futures::future::join_all(views).await.into_iter().collect()
}

/// What the Nodes screen shows of every node.
pub async fn node_infos(targets: &[NodeTarget], timeout: Duration) -> Vec<NodeSummary> {
    futures::future::join_all(targets.iter().map(|t| node_info(t, timeout))).await
}

/// `n2, n3: unpinned 3 images; e2e/y@sha256:… stays pinned for set-b`: nodes with the same outcome said
/// once, in the order given; nodes where nothing happened only when that is all there is to say.
pub fn by_outcome(outcomes: Vec<(String, Option<String>)>) -> String {
    let nothing = "nothing held by this set".to_string();
    let said: Vec<(String, String)> = match outcomes.iter().all(|(_, said)| said.is_none()) {
        true => outcomes
            .into_iter()
            .map(|(node, _)| (node, nothing.clone()))
            .collect(),
        false => outcomes
            .into_iter()
            .filter_map(|(node, said)| Some((node, said?)))
            .collect(),
    };
    let mut grouped: Vec<(Vec<String>, String)> = Vec::new();
    for (node, said) in said {
        match grouped.iter_mut().find(|(_, s)| *s == said) {
            Some((nodes, _)) => nodes.push(node),
            None => grouped.push((vec![node], said)),
        }
    }
    grouped
        .into_iter()
        .map(|(nodes, said)| format!("{}: {said}", nodes.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The CRI-O drop-in as it is and as holding the images of `holds` for their sets would write it (each
/// entry's mark names its sets), under what CRI-O would then have in force.
fn crio_view(config_dir: &Path, holds: &BTreeMap<String, BTreeSet<String>>) -> ConfigView {
    let path = config_dir.join(pins::CRIO_DROP_IN);
    let old = std::fs::read_to_string(&path).ok();
    let config = pins::read_crio_config(config_dir);
    let earlier = config
        .as_ref()
        .ok()
        .and_then(|c| c.before(pins::CRIO_DROP_IN));
    let new = pins::hold_in_drop_in(old.as_deref(), holds, earlier);
    let lines = match &new {
        Ok(new) => crate::model::diff::lines(old.as_deref(), new.as_deref()),
        Err(e) => vec![(DiffKind::Removed, format!("cannot edit: {e}"))],
    };
    let written = new
        .ok()
        .flatten()
        .and_then(|text| pins::crio_entries(&text).ok())
        .unwrap_or_default();
    let wanted: Vec<String> = holds.keys().cloned().collect();
    let held = ConfigNote::held(written.iter().map(|e| &e.holders));
    let mut notes = match config {
        Ok(config) => {
            let patterns = written.into_iter().map(|e| e.pattern).collect();
            let written = config.with_drop_in(pins::CRIO_DROP_IN, patterns);
            ConfigNote::in_force(&written, pins::CRIO_DROP_IN, &wanted)
        }
        Err(e) => vec![ConfigNote {
            text: format!("what CRI-O has in force is unknown: {e}"),
            warning: true,
        }],
    };
    notes.extend(held);
    ConfigView {
        path: path.display().to_string(),
        notes,
        lines,
    }
}

/// containerd keeps pins as image labels: one line per image with who will hold its pin, added where
/// its sets do not hold it yet.
async fn containerd_view(
    client: &CriClient,
    holds: &BTreeMap<String, BTreeSet<String>>,
) -> ConfigView {
    let path = format!(
        "containerd image labels {}={CONTAINERD_PIN_VALUE} and {}<set> (namespace k8s.io)",
        pins::CONTAINERD_PIN_LABEL,
        pins::set_label("")
    );
    let images = pins::containerd_images(client).await.unwrap_or_default();
    let references: Vec<String> = holds.keys().cloned().collect();
    let statuses = client.image_statuses(&references).await;
    let mut held = Vec::new();
    let lines = holds
        .iter()
        .zip(statuses)
        .map(|((image, sets), status)| {
            // Not on the node yet: pinning labels it once it is pulled.
            let before = match status {
                Ok(Some(status)) => pins::image_named(&images, &pins::cri_names(image, &status))
                    .map(pins::ContainerdImage::holders),
                _ => None,
            }
            .unwrap_or_default();
            let mut after = before.clone();
            after.extend(sets.iter().map(|s| Holder::Set(s.clone())));
            let kind = if after == before {
                DiffKind::Same
            } else {
                DiffKind::Added
            };
            let line = format!("{image}  held by {}", HeldBy::from(&after).short());
            held.push(after);
            (kind, line)
        })
        .collect();
    ConfigView {
        path,
        notes: ConfigNote::held(&held).into_iter().collect(),
        lines,
    }
}

/// Each node's lazy pulling as its runtime has it now (None where it cannot be read): what the TUI watches
/// for changes made behind its back (a runtime restarted, a snapshotter gone), cheaply.
pub async fn lazy_states(targets: &[NodeTarget], timeout: Duration) -> Vec<Option<LazyPulling>> {
    let states = targets.iter().map(|target| async move {
        let client = CriClient::connect(&target.node.endpoint, timeout)
            .await
            .ok()?;
        let version = client.version().await.ok()?;
        let kind = runtime_kind(&version.runtime_name).ok()?;
        read_lazy(&client, kind, &target.lazy)
            .await
            .ok()
            .map(|(lazy, _)| lazy)
    });
    futures::future::join_all(states).await
}

/// What the Nodes screen shows for one node. Unknown stays unknown.
async fn node_info(target: &NodeTarget, timeout: Duration) -> NodeSummary {
    let facts = survey_node(&target.node, &[], timeout).await.facts;
    let reachable = facts.unreachable.is_none();
    let mut info = NodeSummary {
        name: target.node.name.clone(),
        runtime: facts.runtime,
        capacity_bytes: facts.capacity_bytes,
        used_bytes: facts.used_bytes,
        available_bytes: facts.available_bytes,
        images: None,
        pinned: None,
        pin_method: None,
        lazy_pulling: None,
        reachable: Some(reachable),
        warning: None,
        cache: None,
    };
    if !reachable {
        return info;
    }
    let Ok((client, pin)) =
        connect_resolved(&target.node.endpoint, target.pin.clone(), timeout).await
    else {
        return info;
    };
    info.pin_method = Some(match pin {
        PinTarget::CrioDropIn { .. } => PinMethod::CrioDropIn,
        _ => PinMethod::ContainerdLabel,
    });
    let Ok(version) = client.version().await else {
        return info;
    };
    let runtime = Runtime::identify(&version.runtime_name, &version.runtime_version);
    let reports = runtime
        .as_ref()
        .map(Runtime::reports_pinned)
        .unwrap_or_default();
    info.warning = runtime.as_ref().and_then(Runtime::outside_known);
    if let Ok(kind) = runtime_kind(&version.runtime_name) {
        match read_lazy(&client, kind, &target.lazy).await {
            Ok((lazy, _)) => {
                info.warning = lazy.warning().or(info.warning);
                info.lazy_pulling = Some(lazy);
            }
            Err(e) => tracing::warn!("{}: cannot read lazy pulling: {e}", target.node.name),
        }
    }
    let Ok(images) = client.list_images().await else {
        return info;
    };
    info.images = Some(images.len());
    // The runtime's word where it reports pins; otherwise the record: CRI-O's files, containerd's label.
    info.pinned = if reports.list_images {
        Some(images.iter().filter(|i| i.pinned).count())
    } else {
        match &pin {
            PinTarget::CrioDropIn { config_dir, .. } => {
                let dir = config_dir.clone();
                tokio::task::spawn_blocking(move || pins::read_crio_config(&dir))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|config| {
                        images
                            .iter()
                            .filter(|i| {
                                config.pins(&[&i.repo_tags[..], &i.repo_digests[..]].concat())
                            })
                            .count()
                    })
            }
            _ => pins::containerd_images(&client)
                .await
                .ok()
                .map(|images| images.iter().filter(|i| i.pin_labelled()).count()),
        }
    };
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each image held by the sets named beside it.
    fn holds(pairs: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(image, sets)| {
                (
                    image.to_string(),
                    sets.iter().map(|s| s.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_crio_nodes_config_view_says_who_holds_each_pin_there_and_after_the_set() {
        let digest = |c: char| c.to_string().repeat(64);
        let [w, x, y, z] =
            ['a', 'b', 'c', 'd'].map(|c| format!("quay.io/ns/{c}@sha256:{}", digest(c)));
        let dir = tempfile::tempdir().unwrap();
        // On the node: w pinned in the OpenShift daemon's shape (no holders: unowned), then y and z for set-b.
        std::fs::write(
            dir.path().join(pins::CRIO_DROP_IN),
            format!("[crio]\n  [crio.image]\n    pinned_images = [\"{w}\"]\n"),
        )
        .unwrap();
        pins::hold_crio_pins(dir.path(), &holds(&[(&y, &["set-b"]), (&z, &["set-b"])])).unwrap();

        // The Config screen for set-a, which lists x and y.
        let view = crio_view(dir.path(), &holds(&[(&x, &["set-a"]), (&y, &["set-a"])]));
        let held: Vec<&str> = view
            .notes
            .iter()
            .filter(|n| n.text.starts_with("held by"))
            .map(|n| n.text.as_str())
            .collect();
        assert_eq!(
            held,
            ["held by: set-a (2), set-b (2), unowned (1)"],
            "{:?}",
            view.notes
        );
        let line = |kind: DiffKind, image: &str, mark: &str| {
            view.lines
                .contains(&(kind, format!("      \"{image}\", # pinboard: {mark}")))
        };
        assert!(line(DiffKind::Added, &x, "set-a"), "{:?}", view.lines);
        assert!(line(DiffKind::Removed, &y, "set-b"), "{:?}", view.lines);
        assert!(
            line(DiffKind::Added, &y, "set-a, set-b"),
            "{:?}",
            view.lines
        );
        assert!(line(DiffKind::Same, &z, "set-b"), "{:?}", view.lines);
        assert!(line(DiffKind::Same, &w, "(unowned)"), "{:?}", view.lines);
        assert!(view.path.ends_with(pins::CRIO_DROP_IN), "{}", view.path);
    }
}
