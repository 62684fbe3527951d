//! Making an image whole on a containerd node whose CRI snapshotter pulls lazily, decided purely: which
//! snapshots go and which are built again from the layer blobs in the content store.
//!
//! A lazily pulled layer is a remote snapshot named by the layer's chain ID; containerd finds an image's
//! layers by those names, so a local copy must take the same name: the remote snapshot goes first, then
//! the layer is applied from its blob into a new snapshot of the same snapshotter, prepared without the
//! remote-snapshot labels (stargz then makes an ordinary overlay snapshot). A snapshot can only go once
//! nothing stands on it: everything built on the first remote layer of the image (its own layers above,
//! other images' layers sharing it) goes too and is built again from the blobs, which must all be in the
//! content store. A container's root filesystem (an active snapshot) on any of them stops it all: the
//! image stays as it is, and the reason says so.

use std::collections::{BTreeMap, HashMap, HashSet};

use sha2::{Digest as _, Sha256};

use super::lazy::ContainerdHoldings;

/// The chain ID of a layer whose uncompressed digest is `diff_id` on the chain `parent` ("" for a bottom
/// layer): its own diff ID at the bottom, else `sha256(parent + " " + diff_id)`, as the OCI image spec
/// defines it; containerd names a layer's committed snapshot by it.
pub fn chain_id(parent: &str, diff_id: &str) -> String {
    match parent {
        "" => diff_id.to_string(),
        parent => format!(
            "sha256:{:x}",
            Sha256::digest(format!("{parent} {diff_id}").as_bytes())
        ),
    }
}

/// The chain IDs of an image's layers, bottom first, from their diff IDs (its config's `rootfs.diff_ids`).
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut chain: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let parent = chain.last().map_or("", String::as_str);
        chain.push(chain_id(parent, diff_id));
    }
    chain
}

/// The media type containerd's differ applies a layer blob beginning with `head` as: gzip, zstd, or a plain
/// tar (its compression is what decides, whatever the manifest called it).
pub fn layer_media_type(head: &[u8]) -> &'static str {
    match head {
        [0x1f, 0x8b, ..] => "application/vnd.oci.image.layer.v1.tar+gzip",
        [0x28, 0xb5, 0x2f, 0xfd, ..] => "application/vnd.oci.image.layer.v1.tar+zstd",
        _ => "application/vnd.oci.image.layer.v1.tar",
    }
}

/// The image to make whole: its layers' chain IDs (the snapshot names) and blob digests, bottom first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub chain: Vec<String>,
    pub layers: Vec<String>,
}

/// One layer to apply: into a snapshot called `name` (its chain ID) on `parent` ("" for a bottom layer),
/// from the blob `layer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    pub name: String,
    pub parent: String,
    pub layer: String,
}

/// What making an image whole takes: snapshots to remove (children before their parents), then layers to
/// build (parents before their children). Empty when the image is whole already.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swap {
    pub remove: Vec<String>,
    pub build: Vec<Build>,
}

/// Why an image cannot be made whole now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Blocked {
    #[error(
        "a container runs from its layers (snapshot {snapshot} stands on them); it is made whole once no \
         container uses it"
    )]
    InUse { snapshot: String },
    #[error(
        "its lazily pulled layers are shared with image {config}, whose layer {layer} is not in the content \
         store: both are made whole together once that image's layers are fetched too"
    )]
    Shared { config: String, layer: String },
    #[error("layer {layer} is not in the content store")]
    Missing { layer: String },
}

/// What making `target` whole on a node holding `holdings` takes.
pub fn swap(holdings: &ContainerdHoldings, target: &Target) -> Result<Swap, Blocked> {
    let first = target.chain.iter().position(|name| {
        holdings
            .snapshot(name)
            .is_none_or(|snapshot| snapshot.remote)
    });
    let Some(first) = first else {
        return Ok(Swap::default());
    };
    // Every snapshot standing on the target's first layer to rebuild (that layer's, if it exists).
    let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
    for (name, snapshot) in holdings.snapshots() {
        children
            .entry(snapshot.parent.as_str())
            .or_default()
            .push(name.as_str());
    }
    let mut gone: HashSet<&str> = HashSet::new();
    let mut stack: Vec<&str> = target.chain[first..]
        .iter()
        .map(String::as_str)
        .filter(|name| holdings.snapshot(name).is_some())
        .collect();
    while let Some(name) = stack.pop() {
        if gone.insert(name) {
            stack.extend(children.get(name).into_iter().flatten());
        }
    }
    if let Some(active) = gone
        .iter()
        .find(|name| holdings.snapshot(name).is_some_and(|s| !s.committed))
    {
        return Err(Blocked::InUse {
            snapshot: active.to_string(),
        });
    }
    // Layers to build, by chain ID: the target's from its first remote or missing one, and those of every
    // image whose chain loses a snapshot.
    let mut build: BTreeMap<String, (usize, Build)> = BTreeMap::new();
    let mut add = |chain: &[String], layers: &[String], from: usize| {
        for at in from..chain.len() {
            let parent = if at == 0 { "" } else { &chain[at - 1] };
            build.entry(chain[at].clone()).or_insert((
                at,
                Build {
                    name: chain[at].clone(),
                    parent: parent.to_string(),
                    layer: layers[at].clone(),
                },
            ));
        }
    };
    if let Some(layer) = target.layers[first..]
        .iter()
        .find(|layer| !holdings.has_blob(layer))
    {
        return Err(Blocked::Missing {
            layer: layer.clone(),
        });
    }
    add(&target.chain, &target.layers, first);
    for (config, top) in holdings.unpacked() {
        let (Some(chain), Some(layers)) = (holdings.chain(top), holdings.layers_of(config)) else {
            continue;
        };
        let Some(from) = chain.iter().position(|name| gone.contains(name)) else {
            continue;
        };
        if chain.len() != layers.len() {
            continue;
        }
        if let Some(layer) = layers[from..]
            .iter()
            .find(|layer| !holdings.has_blob(layer))
        {
            if chain == target.chain {
                return Err(Blocked::Missing {
                    layer: layer.clone(),
                });
            }
            return Err(Blocked::Shared {
                config: config.clone(),
                layer: layer.clone(),
            });
        }
        let chain: Vec<String> = chain.into_iter().map(str::to_string).collect();
        add(&chain, layers, from);
    }
    let mut remove: Vec<&str> = gone.into_iter().collect();
    let depth = |name: &str| holdings.chain(name).map_or(0, |chain| chain.len());
    remove.sort_by_key(|name| (std::cmp::Reverse(depth(name)), *name));
    let mut build: Vec<(usize, Build)> = build.into_values().collect();
    build.sort_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.name.cmp(&y.name)));
    Ok(Swap {
        remove: remove.into_iter().map(str::to_string).collect(),
        build: build.into_iter().map(|(_, b)| b).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lazy::ContainerdSnapshot;

    /// A node with images, each `(config, layers, chain)`, unpacked with `stargz`; `remote` names the
    /// remote snapshots, `active` the containers' (name, parent), `blobs` the layer blobs held.
    fn node(
        images: &[(&str, &[&str], &[&str])],
        remote: &[&str],
        active: &[(&str, &str)],
        blobs: &[&str],
    ) -> ContainerdHoldings {
        let mut content: HashMap<String, HashMap<String, String>> = HashMap::new();
        let mut snapshots = HashMap::new();
        for (config, layers, chain) in images {
            let top = chain.last().unwrap().to_string();
            content.insert(
                config.to_string(),
                HashMap::from([("containerd.io/gc.ref.snapshot.stargz".to_string(), top)]),
            );
            let mut manifest = HashMap::from([(
                "containerd.io/gc.ref.content.config".to_string(),
                config.to_string(),
            )]);
            for (at, layer) in layers.iter().enumerate() {
                manifest.insert(
                    format!("containerd.io/gc.ref.content.l.{at}"),
                    layer.to_string(),
                );
            }
            content.insert(format!("manifest-of-{config}"), manifest);
            for (at, name) in chain.iter().enumerate() {
                let parent = if at == 0 { "" } else { chain[at - 1] };
                snapshots.insert(
                    name.to_string(),
                    ContainerdSnapshot {
                        parent: parent.to_string(),
                        remote: remote.contains(name),
                        committed: true,
                        layer: None,
                        image: None,
                    },
                );
            }
        }
        for (name, parent) in active {
            snapshots.insert(
                name.to_string(),
                ContainerdSnapshot {
                    parent: parent.to_string(),
                    committed: false,
                    ..ContainerdSnapshot::default()
                },
            );
        }
        for blob in blobs {
            content.insert(blob.to_string(), HashMap::new());
        }
        ContainerdHoldings::new("stargz", content, snapshots)
    }

    fn target(chain: &[&str], layers: &[&str]) -> Target {
        Target {
            chain: chain.iter().map(|s| s.to_string()).collect(),
            layers: layers.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn built(swap: &Swap) -> Vec<(&str, &str, &str)> {
        swap.build
            .iter()
            .map(|b| (b.name.as_str(), b.parent.as_str(), b.layer.as_str()))
            .collect()
    }

    #[test]
    fn a_lazily_pulled_image_loses_its_remote_snapshots_and_gets_local_ones_of_the_same_names() {
        let app = ("cfg", &["l0", "l1", "l2"][..], &["c0", "c1", "c2"][..]);
        let holdings = node(&[app], &["c0", "c1", "c2"], &[], &["l0", "l1", "l2"]);
        let swap = swap(&holdings, &target(app.2, app.1)).unwrap();
        assert_eq!(swap.remove, ["c2", "c1", "c0"], "children before parents");
        assert_eq!(
            built(&swap),
            [("c0", "", "l0"), ("c1", "c0", "l1"), ("c2", "c1", "l2")]
        );
    }

    #[test]
    fn local_layers_below_the_first_remote_one_stay() {
        let app = ("cfg", &["l0", "l1", "l2"][..], &["c0", "c1", "c2"][..]);
        let holdings = node(&[app], &["c1"], &[], &["l0", "l1", "l2"]);
        let swap = swap(&holdings, &target(app.2, app.1)).unwrap();
        assert_eq!(swap.remove, ["c2", "c1"]);
        assert_eq!(built(&swap), [("c1", "c0", "l1"), ("c2", "c1", "l2")]);
        let whole = node(&[app], &[], &[], &["l0", "l1", "l2"]);
        assert_eq!(
            self::swap(&whole, &target(app.2, app.1)),
            Ok(Swap::default())
        );
    }

    #[test]
    fn an_image_not_on_the_node_is_built_from_its_blobs() {
        let holdings = node(&[], &[], &[], &["l0", "l1"]);
        let swap = swap(&holdings, &target(&["c0", "c1"], &["l0", "l1"])).unwrap();
        assert!(swap.remove.is_empty());
        assert_eq!(built(&swap), [("c0", "", "l0"), ("c1", "c0", "l1")]);
        assert_eq!(
            self::swap(&holdings, &target(&["c0", "c1", "c2"], &["l0", "l1", "l2"])),
            Err(Blocked::Missing { layer: "l2".into() })
        );
    }

    #[test]
    fn an_image_sharing_a_remote_layer_is_rebuilt_with_it_when_its_blobs_are_there() {
        let app = ("app", &["base", "a"][..], &["cb", "ca"][..]);
        let other = ("other", &["base", "o"][..], &["cb", "co"][..]);
        let holdings = node(&[app, other], &["cb", "ca", "co"], &[], &["base", "a", "o"]);
        let swap = swap(&holdings, &target(app.2, app.1)).unwrap();
        assert_eq!(swap.remove, ["ca", "co", "cb"]);
        assert_eq!(
            built(&swap),
            [("cb", "", "base"), ("ca", "cb", "a"), ("co", "cb", "o")]
        );
        let without = node(&[app, other], &["cb", "ca", "co"], &[], &["base", "a"]);
        assert_eq!(
            self::swap(&without, &target(app.2, app.1)),
            Err(Blocked::Shared {
                config: "other".into(),
                layer: "o".into()
            })
        );
    }

    #[test]
    fn chain_ids_follow_the_oci_image_spec() {
        let diff = |n: u8| format!("sha256:{}", format!("{n:x}").repeat(64));
        let ids = chain_ids(&[diff(1), diff(2)]);
        assert_eq!(ids[0], diff(1));
        let expected = format!(
            "sha256:{:x}",
            Sha256::digest(format!("{} {}", diff(1), diff(2)).as_bytes())
        );
        assert_eq!(ids[1], expected);
        assert_eq!(chain_id(&ids[0], &diff(2)), expected);
        assert_eq!(
            layer_media_type(&[0x1f, 0x8b, 8]),
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        assert_eq!(
            layer_media_type(&[0x28, 0xb5, 0x2f, 0xfd]),
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        assert_eq!(
            layer_media_type(b"etc/"),
            "application/vnd.oci.image.layer.v1.tar"
        );
    }

    #[test]
    fn a_container_on_the_layers_leaves_the_image_as_it_is() {
        let app = ("app", &["l0"][..], &["c0"][..]);
        let holdings = node(&[app], &["c0"], &[("ctr-1", "c0")], &["l0"]);
        assert_eq!(
            swap(&holdings, &target(app.2, app.1)),
            Err(Blocked::InUse {
                snapshot: "ctr-1".into()
            })
        );
    }
}
