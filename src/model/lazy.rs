//! Lazy pulling as pinboard judges it: whether a node pulls lazily, and which of its images are only lazily
//! present. Pure: the backends gather the facts ([`crate::backend::lazy`], [`crate::backend::remote_layers`]).
//!
//! - A node's lazy pulling ([`LazyPulling`]) is what its runtime has in force where it can say (containerd's
//!   CRI `Status` names its snapshotter), against what its files configure and whether the store that
//!   serves the layers is there (stargz-snapshotter's socket, stargz-store's mount): never a file alone.
//! - A lazily present image ([`RemoteLayers`]) has its image record and layers on the node while some
//!   layers' bytes are still in the registry, fetched on first read. containerd: its layers' snapshots
//!   carry `containerd.io/snapshot/remote` (the label stays after a full fetch: it means "was lazy"), or
//!   its layer blobs are absent from the content store while its snapshots exist; how much of each remote
//!   layer stargz-snapshotter has fetched is its per-layer state ([`layer_state`]), and a snapshotter that
//!   does not answer leaves its remote layers unreadable (`unserved`). CRI-O (c/storage): its layers are
//!   additional-layer-store layers (an `additionallayer` file in the layer's directory). For pre-loading
//!   such an image is not there yet: the link is still needed, and stargz-snapshotter 0.12 keeps what it
//!   fetched only until it restarts (each start mounts the layers from the registry again, with an empty
//!   cache), so only the layers' blobs in the content store, unpacked locally, make it whole
//!   ([`super::whole`]).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::runtime::RuntimeKind;

/// The label a remote snapshotter (stargz) puts on the snapshots it mounts from the registry.
pub const REMOTE_SNAPSHOT_LABEL: &str = "containerd.io/snapshot/remote";
/// containerd's garbage-collection label from an image config to the top snapshot of its layers, per
/// snapshotter: `containerd.io/gc.ref.snapshot.<snapshotter>`.
const SNAPSHOT_REF_LABEL: &str = "containerd.io/gc.ref.snapshot.";
/// containerd's labels from a manifest to its config and to its layers (`….l.<position>`).
const CONFIG_REF_LABEL: &str = "containerd.io/gc.ref.content.config";
const LAYER_REF_LABEL: &str = "containerd.io/gc.ref.content.l.";
/// Snapshotters that mount layers from the registry: a CRI plugin using one of them pulls lazily.
pub const REMOTE_SNAPSHOTTERS: [&str; 4] = ["stargz", "nydus", "soci", "overlaybd"];
/// A snapshot chain longer than this is taken for a loop in what containerd reported.
const MAX_LAYERS: usize = 1000;

/// Where a node stands with lazy pulling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LazyState {
    /// On: in force where the runtime can say (containerd), configured with its store there otherwise.
    On,
    /// Configured, but the runtime has not read it yet: on once it restarts.
    OnAfterRestart,
    /// Configured, but what serves the layers is not there (stargz-snapshotter's socket is not live,
    /// stargz-store is not mounted): containerd's pulls fail, CRI-O's are whole.
    StoreNotMounted,
    /// No longer configured, still in force: off once the runtime restarts.
    OffAfterRestart,
    Off,
}

/// A node's lazy pulling, as the Nodes screen, `status -o json` and `pinboard lazy` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LazyPulling {
    pub state: LazyState,
    /// What pulls lazily: a snapshotter (`stargz`) or a store (`stargz-store`); None where not named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Whether the runtime itself reports it in force; None where it cannot say (CRI-O, a cluster pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_force: Option<bool>,
    /// In words: `on (stargz, in force)`, `on after restart`, `configured but store not serving`, `off`.
    pub text: String,
    /// What else is worth knowing: why a store counts as not mounted, the restart that applies it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Where lazy pulling is configured: whether what serves the layers is there (the snapshotter's
    /// socket live, the store mounted). None where it is not configured or could not be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_serving: Option<bool>,
}

impl LazyPulling {
    pub fn new(
        state: LazyState,
        via: Option<&str>,
        in_force: Option<bool>,
        detail: Option<String>,
    ) -> LazyPulling {
        let text = match (state, via, in_force) {
            (LazyState::On, Some(via), Some(true)) => format!("on ({via}, in force)"),
            (LazyState::On, Some(via), _) => format!("on ({via})"),
            (LazyState::On, None, _) => "on".into(),
            (LazyState::OnAfterRestart, ..) => "on after restart".into(),
            (LazyState::StoreNotMounted, ..) => "configured but store not serving".into(),
            (LazyState::OffAfterRestart, ..) => "off after restart".into(),
            (LazyState::Off, ..) => "off".into(),
        };
        LazyPulling {
            state,
            via: via.map(str::to_string),
            in_force,
            text,
            detail,
            store_serving: None,
        }
    }

    /// `self`, saying whether what serves its layers is there.
    fn serving(self, serving: bool) -> LazyPulling {
        LazyPulling {
            store_serving: Some(serving),
            ..self
        }
    }

    /// A cluster pool's lazy pulling, from whether a ContainerRuntimeConfig selecting it turns it on.
    pub fn of_pool(on: bool) -> LazyPulling {
        let state = if on { LazyState::On } else { LazyState::Off };
        LazyPulling::new(state, None, None, None)
    }

    /// The words where a table cell is narrow: the same, but `store not serving`.
    pub fn short(&self) -> &str {
        match self.state {
            LazyState::StoreNotMounted => "store not serving",
            _ => &self.text,
        }
    }

    /// What an operator should know, when anything: `lazy pulling on after restart: containerd reads it
    /// when it restarts: …`.
    pub fn warning(&self) -> Option<String> {
        let pending = !matches!(self.state, LazyState::On | LazyState::Off);
        let detail = self.detail.as_deref().filter(|_| pending)?;
        Some(format!("lazy pulling {}: {detail}", self.text))
    }

    /// Whether it is configured on: what toggling turns off.
    pub fn configured(&self) -> bool {
        matches!(
            self.state,
            LazyState::On | LazyState::OnAfterRestart | LazyState::StoreNotMounted
        )
    }
}

/// One node's lazy pulling as `pinboard lazy` prints it: what it is, and what turning it on or off did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLazy {
    pub node: String,
    /// `containerd 1.6.20`; None when the node could not be asked.
    pub runtime: Option<String>,
    pub reachable: bool,
    /// None when it could not be read (`error` says why).
    pub lazy_pulling: Option<LazyPulling>,
    /// The file pinboard writes for the node.
    pub file: Option<String>,
    /// What became of that file; None for `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<FileChangeKind>,
    /// The command pinboard ran to restart the runtime (`--restart`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted: Option<String>,
    /// `--readonly`: the file as the change would write it, each line marked `+ ` (added), `- `
    /// (removed) or two spaces (kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diff: Vec<String>,
    /// Why nothing was done, when nothing could be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// containerd's config imports no directory for pinboard's file: the lines to add, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<AddLines>,
}

/// Lines an administrator adds to a file, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddLines {
    pub lines: Vec<String>,
    /// `before line 4 (`[grpc]`) of /etc/containerd/config.toml`.
    pub place: String,
}

/// What became of the file pinboard writes for lazy pulling on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileChangeKind {
    Written,
    Unchanged,
    /// `--readonly`: it would be written.
    WouldWrite,
    /// Refused, or writing failed: `error` says why.
    NotWritten,
}

impl FileChangeKind {
    pub fn word(self) -> &'static str {
        match self {
            FileChangeKind::Written => "written",
            FileChangeKind::Unchanged => "unchanged",
            FileChangeKind::WouldWrite => "would write",
            FileChangeKind::NotWritten => "not written",
        }
    }
}

/// containerd's lazy pulling: whether pinboard's file configures the snapshotter `via`, which snapshotter
/// the CRI plugin reports in force (None: it could not be asked), and whether the snapshotter's socket
/// serves. `restart` is the command that applies a change.
pub fn containerd_lazy(
    via: &str,
    configured: bool,
    in_force: Option<&str>,
    socket_live: bool,
    restart: &str,
) -> LazyPulling {
    let remote = in_force.map(|s| s == via || REMOTE_SNAPSHOTTERS.contains(&s));
    let not_live = format!("{via}'s socket is not live: containerd's pulls fail until it serves");
    let (state, detail) = match (configured, remote) {
        (true, Some(true)) | (true, None) if !socket_live => {
            (LazyState::StoreNotMounted, Some(not_live))
        }
        (true, Some(true)) | (true, None) => (LazyState::On, None),
        (true, Some(false)) => {
            let mut detail = format!("containerd reads it when it restarts: `{restart}`");
            if !socket_live {
                detail.push_str(&format!("; {not_live}"));
            }
            (LazyState::OnAfterRestart, Some(detail))
        }
        (false, Some(true)) => (
            LazyState::OffAfterRestart,
            Some(format!(
                "containerd still uses the snapshotter {}; `{restart}` applies the change",
                in_force.unwrap_or(via)
            )),
        ),
        (false, _) => (LazyState::Off, None),
    };
    let via = in_force.filter(|_| remote == Some(true)).unwrap_or(via);
    let lazy = LazyPulling::new(state, Some(via), remote, detail);
    match configured {
        true => lazy.serving(socket_live),
        false => lazy,
    }
}

/// CRI-O's lazy pulling: whether its storage drop-in names stargz-store, and whether the store is mounted
/// (`not_mounted` says why not). CRI-O does not report what it has in force: it reads the drop-in when it
/// starts, which the detail says with the command.
pub fn crio_lazy(configured: bool, not_mounted: Option<String>) -> LazyPulling {
    let when = format!(
        "CRI-O reads it when it starts: `{}` applies a change",
        restart_command(RuntimeKind::Crio)
    );
    match (configured, not_mounted) {
        (false, _) => LazyPulling::new(LazyState::Off, None, None, None),
        (true, Some(why)) => LazyPulling::new(
            LazyState::StoreNotMounted,
            None,
            None,
            Some(format!("{why}; {when}")),
        )
        .serving(false),
        (true, None) => {
            LazyPulling::new(LazyState::On, Some("stargz-store"), None, Some(when)).serving(true)
        }
    }
}

/// The command that restarts `runtime` so that it reads its lazy-pull configuration again.
pub fn restart_command(runtime: RuntimeKind) -> &'static str {
    match runtime {
        RuntimeKind::Containerd => "systemctl restart containerd",
        RuntimeKind::Crio => "systemctl restart crio",
    }
}

/// How to make a node's lazily present images whole, by its runtime (`containerd 1.6.20`). containerd:
/// `pinboard apply` fetches their layers into its content store and unpacks them locally
/// ([`super::whole`]). CRI-O: without the additional layer store a pull fetches them whole; pinboard does
/// not remove images.
pub fn make_local(runtime: Option<&str>) -> String {
    let kind = runtime
        .and_then(|r| r.split_whitespace().next())
        .and_then(RuntimeKind::of_cri_name);
    match kind {
        Some(RuntimeKind::Crio) => format!(
            "to make them local, remove them (`crictl rmi IMAGE`) and pull them again without the additional \
             layer store (`pinboard lazy off`, `{}`, `pinboard apply`)",
            restart_command(RuntimeKind::Crio)
        ),
        _ => "`pinboard apply` makes them whole: it fetches their layers into containerd's content store and \
              unpacks them there"
            .into(),
    }
}

/// Why images whose remote layers the snapshotter does not serve cannot start a container, and the fix:
/// stargz-snapshotter 0.12 mounts every remote layer from the registry again as it starts, and exits when
/// one cannot be (the registry unreachable, or a private image's credentials, which its CRI keychain keeps
/// only in memory, lost with its restart).
pub fn unserved_fix() -> &'static str {
    "no container can start from them until the snapshotter serves again: start it; as it starts it mounts \
     each remote layer from the registry again and exits when one cannot be, so restore the link, or give it \
     the credentials of private images where its docker-config keychain reads them ($DOCKER_CONFIG/config.json: \
     those it took from CRI pulls are lost when it restarts); then `pinboard apply` makes them whole"
}

/// The layers of a lazily present image whose bytes are still in the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteLayers {
    /// Their positions in the image, the bottom layer 0, as its manifest lists them.
    pub remote_layers: Vec<usize>,
    /// How many layers the image has.
    pub layers: usize,
    /// Of the remote layers' bytes, what the snapshotter says it has fetched (stargz's per-layer state),
    /// where pinboard can read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched: Option<Fetched>,
    /// Set when the snapshotter that serves the image's layers does not answer: why. No container can start
    /// from the image then, and which of its layers are remote cannot be told but by their blobs: those
    /// absent (`remoteLayers`, which may then be empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unserved: Option<String>,
}

/// Bytes a snapshotter has fetched of layers it serves from the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fetched {
    pub bytes: u64,
    /// The layers' compressed size.
    pub of: u64,
}

impl Fetched {
    /// `6 %`: whole percents, rounded down, so that 100 % means every byte.
    pub fn percent(&self) -> String {
        let percent = (self.bytes.min(self.of) * 100)
            .checked_div(self.of)
            .unwrap_or(100);
        format!("{percent} %")
    }
}

impl RemoteLayers {
    /// From each layer, bottom first, whether it is remote; None when none is.
    pub fn of(remote: &[bool]) -> Option<RemoteLayers> {
        let remote_layers: Vec<usize> = (0..remote.len()).filter(|&i| remote[i]).collect();
        (!remote_layers.is_empty()).then_some(RemoteLayers {
            remote_layers,
            layers: remote.len(),
            fetched: None,
            unserved: None,
        })
    }

    /// `3 of 5 layers remote`, then `, 62.10 MiB only in the registry, 6 % fetched` or `, not served` when known; `layers not served` for
    /// an image whose blobs are all here but whose snapshotter does not answer.
    pub fn count(&self) -> String {
        if self.remote_layers.is_empty() {
            return "layers not served".into();
        }
        let mut words = remote_count(self.remote_layers.len(), self.layers);
        if self.unserved.is_some() {
            words.push_str(", not served");
        } else if let Some(fetched) = &self.fetched {
            let remote = fetched.of.saturating_sub(fetched.bytes);
            words.push_str(&format!(
                ", {} only in the registry, {} fetched",
                super::units::human(remote),
                fetched.percent()
            ));
        }
        words
    }

    /// `lazy (3 of 5 layers remote, 62.10 MiB only in the registry, 6 % fetched)`; `unreadable (layers not
    /// served)`.
    pub fn words(&self) -> String {
        match self.remote_layers.is_empty() {
            true => format!("unreadable ({})", self.count()),
            false => format!("lazy ({})", self.count()),
        }
    }
}

/// `3 of 5 layers remote`.
pub fn remote_count(remote: usize, layers: usize) -> String {
    let plural = if layers == 1 { "" } else { "s" };
    format!("{remote} of {layers} layer{plural} remote")
}

/// `lazy (3 of 5 layers remote)`: how the Rollout, `status` and `apply` say an image is present only lazily.
pub fn lazy_words(remote: usize, layers: usize) -> String {
    format!("lazy ({})", remote_count(remote, layers))
}

/// One containerd snapshot: its parent (empty for a bottom layer), whether it is remote, whether it is
/// committed (an image layer; an active one is a container's root filesystem), and the layer and image
/// it was pulled for (the CRI plugin's `containerd.io/snapshot/cri.layer-digest` and `…/cri.image-ref`),
/// when it says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerdSnapshot {
    pub parent: String,
    pub remote: bool,
    pub committed: bool,
    pub layer: Option<String>,
    pub image: Option<String>,
}

/// What stargz-snapshotter says of one layer it serves: its compressed size and the bytes fetched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerFetch {
    pub size: u64,
    pub fetched: u64,
}

/// A layer's state as stargz-snapshotter writes it in `/.stargz-snapshotter/<digest>.json` of the
/// layer's mount (`{"digest", "size", "fetchedSize", "fetchedPercent"}`, and `error` once one happened):
/// its digest and what it fetched. None for anything else.
pub fn layer_state(json: &str) -> Option<(String, LayerFetch)> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct State {
        digest: String,
        size: u64,
        fetched_size: u64,
    }
    let state: State = serde_json::from_str(json).ok()?;
    Some((
        state.digest,
        LayerFetch {
            size: state.size,
            fetched: state.fetched_size,
        },
    ))
}

/// What a containerd node holds of its images: the content store's blobs with their labels, and the CRI
/// plugin's snapshotter with its snapshots, by name; what the snapshotter says it fetched of the layers it
/// serves; and, when the snapshotter did not answer, why.
#[derive(Clone, Debug, Default)]
pub struct ContainerdHoldings {
    snapshotter: String,
    /// Every blob's digest, with its labels.
    content: HashMap<String, HashMap<String, String>>,
    snapshots: HashMap<String, ContainerdSnapshot>,
    /// Per config digest, its manifest's layer digests in order.
    layers_of: HashMap<String, Vec<String>>,
    /// Per layer digest, what the snapshotter fetched of it (stargz's state files, where readable).
    fetch: HashMap<String, LayerFetch>,
    /// Why the snapshotter's snapshots could not be listed: it does not answer.
    unserved: Option<String>,
}

impl ContainerdHoldings {
    pub fn new(
        snapshotter: &str,
        content: HashMap<String, HashMap<String, String>>,
        snapshots: HashMap<String, ContainerdSnapshot>,
    ) -> ContainerdHoldings {
        let mut layers_of = HashMap::new();
        for labels in content.values() {
            let Some(config) = labels.get(CONFIG_REF_LABEL) else {
                continue;
            };
            let mut layers: Vec<(usize, &String)> = labels
                .iter()
                .filter_map(|(key, digest)| {
                    Some((key.strip_prefix(LAYER_REF_LABEL)?.parse().ok()?, digest))
                })
                .collect();
            layers.sort();
            let in_order = layers.iter().enumerate().all(|(i, (at, _))| i == *at);
            if in_order {
                let digests = layers.into_iter().map(|(_, d)| d.clone()).collect();
                layers_of.insert(config.clone(), digests);
            }
        }
        ContainerdHoldings {
            snapshotter: snapshotter.to_string(),
            content,
            snapshots,
            layers_of,
            fetch: HashMap::new(),
            unserved: None,
        }
    }

    /// The same holdings, with what the snapshotter says it fetched of each layer, by digest.
    pub fn with_fetch(mut self, fetch: HashMap<String, LayerFetch>) -> ContainerdHoldings {
        self.fetch = fetch;
        self
    }

    /// Holdings of a node whose remote snapshotter did not answer (`why`): its content store only, and no
    /// layer it serves can be read.
    pub fn unserved(
        snapshotter: &str,
        content: HashMap<String, HashMap<String, String>>,
        why: String,
    ) -> ContainerdHoldings {
        ContainerdHoldings {
            unserved: Some(why),
            ..ContainerdHoldings::new(snapshotter, content, HashMap::new())
        }
    }

    pub fn snapshotter(&self) -> &str {
        &self.snapshotter
    }

    /// Why the snapshotter's snapshots could not be listed, when they could not.
    pub fn unserved_reason(&self) -> Option<&str> {
        self.unserved.as_deref()
    }

    /// The snapshot called `name`.
    pub fn snapshot(&self, name: &str) -> Option<&ContainerdSnapshot> {
        self.snapshots.get(name)
    }

    /// Every snapshot, by name.
    pub fn snapshots(&self) -> impl Iterator<Item = (&String, &ContainerdSnapshot)> {
        self.snapshots.iter()
    }

    /// Whether the content store holds the blob `digest`.
    pub fn has_blob(&self, digest: &str) -> bool {
        self.content.contains_key(digest)
    }

    /// Every image config whose image is unpacked for the CRI plugin's snapshotter, with its top snapshot.
    pub fn unpacked(&self) -> impl Iterator<Item = (&String, &String)> {
        let label = format!("{SNAPSHOT_REF_LABEL}{}", self.snapshotter);
        self.content
            .iter()
            .filter_map(move |(config, labels)| Some((config, labels.get(&label)?)))
    }

    /// The layer digests, bottom first, of the image whose config is `config`, as its manifest's labels
    /// name them.
    pub fn layers_of(&self, config: &str) -> Option<&[String]> {
        self.layers_of.get(config).map(Vec::as_slice)
    }

    /// The manifest (its digest) whose labels name `config` as its config.
    pub fn manifest_of(&self, config: &str) -> Option<&str> {
        self.content
            .iter()
            .find(|(_, labels)| labels.get(CONFIG_REF_LABEL).is_some_and(|c| c == config))
            .map(|(digest, _)| digest.as_str())
    }

    /// The reference the image whose config is `config` was pulled by, as its remote snapshots name it
    /// (the topmost that does).
    pub fn reference_of(&self, config: &str) -> Option<&str> {
        let label = format!("{SNAPSHOT_REF_LABEL}{}", self.snapshotter);
        let top = self.content.get(config)?.get(&label)?;
        self.chain(top)?
            .into_iter()
            .rev()
            .find_map(|name| self.snapshots.get(name)?.image.as_deref())
    }

    /// The snapshot chain, bottom first, from `top`; None when it is broken.
    pub fn chain<'a>(&'a self, top: &'a str) -> Option<Vec<&'a str>> {
        layer_chain(top, |name| {
            self.snapshots
                .get(name)
                .map(|s| Some(s.parent.as_str()).filter(|p| !p.is_empty()))
        })
    }

    /// The remote layers of the image whose config is `config` (CRI's image ID): a layer is remote when
    /// its snapshot carries the remote label, or its blob is not in the content store while its snapshot
    /// exists; with what the snapshotter fetched of them. When the snapshotter does not answer, every
    /// image unpacked for it is unserved, its layers whose blobs are absent remote. None when none is, or
    /// the image is not unpacked for the CRI plugin's snapshotter.
    pub fn remote_layers(&self, config: &str) -> Option<RemoteLayers> {
        let label = format!("{SNAPSHOT_REF_LABEL}{}", self.snapshotter);
        let top = self.content.get(config)?.get(&label)?;
        if let Some(why) = &self.unserved {
            let digests = self.layers_of.get(config)?;
            return Some(RemoteLayers {
                remote_layers: (0..digests.len())
                    .filter(|&at| !self.has_blob(&digests[at]))
                    .collect(),
                layers: digests.len(),
                fetched: None,
                unserved: Some(why.clone()),
            });
        }
        let chain = self.chain(top)?;
        let blobs = self
            .layers_of
            .get(config)
            .filter(|digests| digests.len() == chain.len());
        let remote: Vec<bool> = chain
            .iter()
            .enumerate()
            .map(|(at, name)| {
                let labelled = self.snapshots.get(*name).is_some_and(|s| s.remote);
                let absent = blobs.is_some_and(|digests| !self.has_blob(&digests[at]));
                labelled || absent
            })
            .collect();
        let mut lazy = RemoteLayers::of(&remote)?;
        let states: Vec<&LayerFetch> = lazy
            .remote_layers
            .iter()
            .filter_map(|&at| {
                let snapshot = self.snapshots.get(chain[at])?;
                let digest = snapshot
                    .layer
                    .as_ref()
                    .or_else(|| blobs.map(|digests| &digests[at]))?;
                self.fetch.get(digest)
            })
            .collect();
        if states.len() == lazy.remote_layers.len() {
            lazy.fetched = Some(Fetched {
                bytes: states.iter().map(|s| s.fetched).sum(),
                of: states.iter().map(|s| s.size).sum(),
            });
        }
        Some(lazy)
    }
}

/// A layer chain, bottom first, from its `top` layer: `parent_of` gives a layer's parent (None: it is the
/// bottom), or None for a layer that is not there. None when the chain is broken or loops.
pub fn layer_chain<'a>(
    top: &'a str,
    parent_of: impl Fn(&str) -> Option<Option<&'a str>>,
) -> Option<Vec<&'a str>> {
    let mut chain = vec![top];
    let mut seen = HashSet::from([top]);
    while let Some(parent) = parent_of(chain[chain.len() - 1])? {
        if !seen.insert(parent) || chain.len() >= MAX_LAYERS {
            return None;
        }
        chain.push(parent);
    }
    chain.reverse();
    Some(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A node holding one image of three layers (chain a, b, c), unpacked with the native snapshotter;
    /// `blobs` says which layer blobs the content store still has, `remote` which snapshots are labelled.
    fn node(blobs: [bool; 3], remote: [bool; 3]) -> ContainerdHoldings {
        let mut content = HashMap::from([
            (
                "sha256:config".to_string(),
                labels(&[("containerd.io/gc.ref.snapshot.native", "c")]),
            ),
            (
                "sha256:manifest".to_string(),
                labels(&[
                    ("containerd.io/gc.ref.content.config", "sha256:config"),
                    ("containerd.io/gc.ref.content.l.0", "sha256:l0"),
                    ("containerd.io/gc.ref.content.l.1", "sha256:l1"),
                    ("containerd.io/gc.ref.content.l.2", "sha256:l2"),
                ]),
            ),
        ]);
        for (at, held) in blobs.iter().enumerate() {
            if *held {
                content.insert(format!("sha256:l{at}"), HashMap::new());
            }
        }
        let snapshots = [("a", ""), ("b", "a"), ("c", "b")]
            .iter()
            .zip(remote)
            .map(|((name, parent), remote)| {
                (
                    name.to_string(),
                    ContainerdSnapshot {
                        parent: parent.to_string(),
                        remote,
                        committed: true,
                        layer: None,
                        image: None,
                    },
                )
            })
            .collect();
        ContainerdHoldings::new("native", content, snapshots)
    }

    #[test]
    fn a_containerd_layer_is_remote_by_its_label_or_its_missing_blob() {
        assert_eq!(
            node([true; 3], [false; 3]).remote_layers("sha256:config"),
            None
        );
        let labelled = node([true; 3], [true, false, true]).remote_layers("sha256:config");
        assert_eq!(labelled, RemoteLayers::of(&[true, false, true]));
        assert_eq!(labelled.unwrap().remote_layers, [0, 2]);
        let removed = node([false, true, false], [false; 3])
            .remote_layers("sha256:config")
            .unwrap();
        assert_eq!(removed.remote_layers, [0, 2]);
        assert_eq!(
            node([false; 3], [true; 3])
                .remote_layers("sha256:config")
                .unwrap()
                .words(),
            "lazy (3 of 3 layers remote)"
        );
        // Not unpacked for the CRI plugin's snapshotter: nothing to say.
        let mut other = node([false; 3], [true; 3]);
        other.snapshotter = "overlayfs".into();
        assert_eq!(other.remote_layers("sha256:config"), None);
        assert_eq!(
            node([false; 3], [true; 3]).remote_layers("sha256:other"),
            None
        );
    }

    #[test]
    fn stargz_says_how_much_of_each_remote_layer_it_fetched() {
        // As stargz-snapshotter 0.12 writes it in the layer's mount.
        let (digest, state) = layer_state(
            r#"{"digest":"sha256:l0","size":31074300,"fetchedSize":24300,"fetchedPercent":0.0781996698236163}"#,
        )
        .unwrap();
        assert_eq!(digest, "sha256:l0");
        assert_eq!(
            state,
            LayerFetch {
                size: 31_074_300,
                fetched: 24_300
            }
        );
        assert_eq!(layer_state("not json"), None);
        let fetch = |l0: u64, l2: u64| {
            HashMap::from([
                (
                    "sha256:l0".to_string(),
                    LayerFetch {
                        size: 1000,
                        fetched: l0,
                    },
                ),
                (
                    "sha256:l2".to_string(),
                    LayerFetch {
                        size: 1000,
                        fetched: l2,
                    },
                ),
            ])
        };
        let lazy = node([false, true, false], [true, false, true])
            .with_fetch(fetch(60, 60))
            .remote_layers("sha256:config")
            .unwrap();
        assert_eq!(
            lazy.fetched,
            Some(Fetched {
                bytes: 120,
                of: 2000
            })
        );
        assert_eq!(
            lazy.words(),
            "lazy (2 of 3 layers remote, 1.84 KiB only in the registry, 6 % fetched)"
        );
        let all = node([false, true, false], [true, false, true])
            .with_fetch(fetch(1000, 999))
            .remote_layers("sha256:config")
            .unwrap();
        assert_eq!(
            all.count(),
            "2 of 3 layers remote, 1 B only in the registry, 99 % fetched",
            "never 100 short of every byte"
        );
        // A remote layer the snapshotter says nothing of: nothing is said of the whole.
        let partly = node([false, true, false], [true, false, true])
            .with_fetch(HashMap::from([(
                "sha256:l0".to_string(),
                LayerFetch {
                    size: 1,
                    fetched: 1,
                },
            )]))
            .remote_layers("sha256:config")
            .unwrap();
        assert_eq!(partly.fetched, None);
    }

    #[test]
    fn images_a_snapshotter_that_does_not_answer_serves_are_unserved_remote_by_their_blobs() {
        let held = node([true, false, false], [true; 3]);
        let down =
            ContainerdHoldings::unserved("native", held.content, "connection refused".into());
        let lazy = down.remote_layers("sha256:config").unwrap();
        assert_eq!(lazy.remote_layers, [1, 2]);
        assert_eq!(lazy.unserved.as_deref(), Some("connection refused"));
        assert_eq!(lazy.words(), "lazy (2 of 3 layers remote, not served)");
        // Every blob here, yet no container can start from it, nor can it be told whether its snapshots
        // are still remote.
        let blobs = node([true; 3], [false; 3]).content;
        let whole = ContainerdHoldings::unserved("native", blobs, "x".into())
            .remote_layers("sha256:config")
            .unwrap();
        assert!(whole.remote_layers.is_empty());
        assert_eq!(whole.words(), "unreadable (layers not served)");
        assert_eq!(
            ContainerdHoldings::unserved("stargz", HashMap::new(), "x".into())
                .remote_layers("sha256:config"),
            None,
            "not unpacked for it"
        );
    }

    #[test]
    fn a_layer_chain_is_walked_from_the_top_and_a_loop_is_refused() {
        let parents = HashMap::from([("c", Some("b")), ("b", Some("a")), ("a", None)]);
        let parent_of = |l: &str| parents.get(l).copied();
        assert_eq!(layer_chain("c", parent_of), Some(vec!["a", "b", "c"]));
        assert_eq!(layer_chain("x", parent_of), None);
        let looped = HashMap::from([("a", Some("b")), ("b", Some("a"))]);
        assert_eq!(layer_chain("a", |l| looped.get(l).copied()), None);
    }

    #[test]
    fn containerds_lazy_pulling_is_what_it_reports_in_force() {
        let restart = "systemctl restart containerd";
        let state = |configured, in_force, live| {
            let lazy = containerd_lazy("stargz", configured, in_force, live, restart);
            (lazy.state, lazy.text)
        };
        assert_eq!(
            state(true, Some("stargz"), true),
            (LazyState::On, "on (stargz, in force)".into())
        );
        assert_eq!(
            state(true, Some("overlayfs"), true),
            (LazyState::OnAfterRestart, "on after restart".into())
        );
        assert_eq!(
            state(true, Some("stargz"), false),
            (
                LazyState::StoreNotMounted,
                "configured but store not serving".into()
            )
        );
        assert_eq!(
            state(false, Some("stargz"), true),
            (LazyState::OffAfterRestart, "off after restart".into())
        );
        assert_eq!(
            state(false, Some("overlayfs"), false),
            (LazyState::Off, "off".into())
        );
        // Runtime could not be asked: the file and the socket decide, and it is not said to be in force.
        assert_eq!(
            state(true, None, true),
            (LazyState::On, "on (stargz)".into())
        );
        let after = containerd_lazy("stargz", true, Some("native"), false, restart);
        assert_eq!(
            after.detail.as_deref(),
            Some(
                "containerd reads it when it restarts: `systemctl restart containerd`; stargz's socket is \
                 not live: containerd's pulls fail until it serves"
            )
        );
        assert!(after.configured());
    }

    #[test]
    fn crio_lazy_pulling_is_its_drop_in_and_its_store() {
        assert_eq!(crio_lazy(true, None).text, "on (stargz-store)");
        let unmounted = crio_lazy(
            true,
            Some("/var/lib/stargz-store/store is not mounted".into()),
        );
        assert_eq!(unmounted.state, LazyState::StoreNotMounted);
        assert!(unmounted.configured());
        assert!(!crio_lazy(false, None).configured());
        let json = serde_json::to_value(crio_lazy(true, None)).unwrap();
        assert_eq!(json["state"], "on");
        assert_eq!(json["text"], "on (stargz-store)");
        assert_eq!(LazyPulling::of_pool(true).text, "on");
    }
}
