//! containerd's pins: the label `io.cri-containerd.pinned=pinned` on every image record of the image, and
//! one label per holding set ([`set_label`]: `pinboard.dev/set.<name>=<name>`), through containerd's images
//! service on the CRI socket. The pin label stays while any holder does. A pin label without holder labels
//! is unowned; when a set holds such an image, `pinboard.dev/unowned=adopted` keeps it unowned beside the
//! set. Images are never deleted.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sha2::{Digest as _, Sha256};

use super::PinError;
use crate::backend::cri::{self, CriClient};
use crate::backend::proto::containerd_images::{
    GetImageRequest, Image as ContainerdRecord, ListImagesRequest, UpdateImageRequest,
    images_client::ImagesClient,
};
use crate::backend::proto::cri::Image;
use crate::model::holders::{Holder, Holders, PinChange, ReleaseScope};

pub const CONTAINERD_PIN_LABEL: &str = "io.cri-containerd.pinned";
pub const CONTAINERD_PIN_VALUE: &str = "pinned";
/// The containerd namespace the CRI plugin keeps its images in.
pub const CONTAINERD_NAMESPACE: &str = "k8s.io";

/// A request to one of containerd's own services, in the CRI plugin's namespace.
pub(crate) fn namespaced<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "containerd-namespace",
        CONTAINERD_NAMESPACE.parse().expect("ascii"),
    );
    request
}

/// Where the holder labels of a set go: `pinboard.dev/set.<name>` while that stays within a Kubernetes
/// label name's 63 characters (a set name is a DNS subdomain, so the key is a valid label key), else
/// `pinboard.dev/set-sha256.<first 40 hex digits of the name's SHA-256>`. The value is always the full
/// name: what is read back.
pub fn set_label(name: &str) -> String {
    const NAME_MAX: usize = 63;
    let plain = format!("set.{name}");
    if plain.len() <= NAME_MAX {
        return format!("{LABEL_DOMAIN}/{plain}");
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..20].iter().map(|b| format!("{b:02x}")).collect();
    format!("{SET_HASH_LABEL}{hex}")
}

const LABEL_DOMAIN: &str = "pinboard.dev";
const SET_LABEL: &str = "pinboard.dev/set.";
const SET_HASH_LABEL: &str = "pinboard.dev/set-sha256.";
/// On an image a set holds that was pinned before (an earlier pinboard's, or someone else's pin label):
/// that pin stays when the last set lets go.
pub const UNOWNED_LABEL: &str = "pinboard.dev/unowned";
const UNOWNED_VALUE: &str = "adopted";

/// Who holds the pin of a record with `labels`: a set per holder label, and unowned when the record says
/// so, or carries the pin label with no holder label at all.
pub fn label_holders(labels: &HashMap<String, String>) -> Holders {
    let mut holders: Holders = labels
        .iter()
        .filter(|(key, _)| key.starts_with(SET_LABEL) || key.starts_with(SET_HASH_LABEL))
        .map(|(_, name)| Holder::Set(name.clone()))
        .collect();
    let pinned = labels.get(CONTAINERD_PIN_LABEL).map(String::as_str) == Some(CONTAINERD_PIN_VALUE);
    if labels.contains_key(UNOWNED_LABEL) || (pinned && holders.is_empty()) {
        holders.insert(Holder::Unowned);
    }
    holders
}

/// The label changes that make a record with `labels` say `holders`: a value to set, or None to remove.
/// The pin label stays while any holder does; the unowned mark is needed only beside a set.
fn label_changes(
    labels: &HashMap<String, String>,
    holders: &Holders,
) -> BTreeMap<String, Option<String>> {
    let mut wanted: BTreeMap<String, String> = holders
        .iter()
        .filter_map(|h| match h {
            Holder::Set(name) => Some((set_label(name), name.clone())),
            _ => None,
        })
        .collect();
    if holders.contains(&Holder::Unowned) && !wanted.is_empty() {
        wanted.insert(UNOWNED_LABEL.into(), UNOWNED_VALUE.into());
    }
    if !holders.is_empty() {
        wanted.insert(CONTAINERD_PIN_LABEL.into(), CONTAINERD_PIN_VALUE.into());
    }
    let ours = |key: &str| {
        key.starts_with(SET_LABEL)
            || key.starts_with(SET_HASH_LABEL)
            || key == UNOWNED_LABEL
            || key == CONTAINERD_PIN_LABEL
    };
    let mut changes: BTreeMap<String, Option<String>> = labels
        .keys()
        .filter(|key| ours(key) && !wanted.contains_key(*key))
        .map(|key| (key.clone(), None))
        .collect();
    for (key, value) in wanted {
        if labels.get(&key) != Some(&value) {
            changes.insert(key, Some(value));
        }
    }
    changes
}

/// One image as containerd's records show it: every record (name) pointing at the same content.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerdImage {
    /// Each record whole, as containerd lists it: an update sends its target back.
    pub records: Vec<ContainerdRecord>,
}

impl ContainerdImage {
    pub fn names(&self) -> Vec<String> {
        self.records.iter().map(|r| r.name.clone()).collect()
    }

    /// Who holds its pin, over every record.
    pub fn holders(&self) -> Holders {
        self.records
            .iter()
            .flat_map(|r| label_holders(&r.labels))
            .collect()
    }

    /// Whether any record carries the pin label.
    pub fn pin_labelled(&self) -> bool {
        self.records.iter().any(|r| {
            r.labels.get(CONTAINERD_PIN_LABEL).map(String::as_str) == Some(CONTAINERD_PIN_VALUE)
        })
    }

    /// The name to show: a reference by digest if it has one, else any.
    pub fn shown(&self) -> String {
        let names = self.names();
        names
            .iter()
            .find(|n| n.contains('@'))
            .or_else(|| names.iter().find(|n| !n.starts_with("sha256:")))
            .or(names.first())
            .cloned()
            .unwrap_or_default()
    }

    fn known_as(&self, names: &[&str]) -> bool {
        self.records
            .iter()
            .any(|r| names.contains(&r.name.as_str()))
    }
}

/// Every image of the node in containerd's CRI namespace, its records grouped by the content they point
/// at (one List call).
pub async fn containerd_images(client: &CriClient) -> Result<Vec<ContainerdImage>, PinError> {
    let listed = ImagesClient::new(client.channel())
        .max_decoding_message_size(cri::MAX_DECODE_BYTES)
        .list(namespaced(ListImagesRequest::default()))
        .await
        .map_err(|status| containerd_error("List", "images", &status))?
        .into_inner()
        .images;
    let mut by_target: BTreeMap<String, ContainerdImage> = BTreeMap::new();
    for record in listed {
        let target = record
            .target
            .as_ref()
            .map_or_else(|| record.name.clone(), |t| t.digest.clone());
        by_target.entry(target).or_default().records.push(record);
    }
    Ok(by_target.into_values().collect())
}

/// The image of `images` known by one of `names` (a reference, and the repo digests, tags and id CRI's
/// ImageStatus reports for it).
pub fn image_named<'i>(
    images: &'i [ContainerdImage],
    names: &[&str],
) -> Option<&'i ContainerdImage> {
    images.iter().find(|i| i.known_as(names))
}

/// `reference` and every name CRI's ImageStatus `status` gives the image: the names its records may have.
pub fn cri_names<'a>(reference: &'a str, status: &'a Image) -> Vec<&'a str> {
    std::iter::once(reference)
        .chain(status.repo_digests.iter().map(String::as_str))
        .chain(status.repo_tags.iter().map(String::as_str))
        .chain(std::iter::once(status.id.as_str()))
        .filter(|n| !n.is_empty())
        .collect()
}

/// The request that changes `record`'s labels by `changes` (a value to set, or None to remove) and
/// nothing else. It carries the whole record as listed, target included, as `ctr images label` sends it:
/// containerd's API requires an image's target, and 1.7 and 2.x dereference it whatever the mask says
/// (without it their images service panics and containerd exits).
fn label_update(
    record: &ContainerdRecord,
    changes: &BTreeMap<String, Option<String>>,
) -> UpdateImageRequest {
    let mut image = record.clone();
    for (key, value) in changes {
        match value {
            Some(value) => image.labels.insert(key.clone(), value.clone()),
            None => image.labels.remove(key),
        };
    }
    UpdateImageRequest {
        image: Some(image),
        update_mask: Some(prost_types::FieldMask {
            paths: changes.keys().map(|k| format!("labels.{k}")).collect(),
        }),
    }
}

/// The records a run of label writes changed, each as it was before, so that a write failing halfway puts
/// them back: pins are written whole or not at all.
#[derive(Default)]
struct Written(Vec<ContainerdRecord>);

impl Written {
    /// Puts every changed record's labels back as they were (best effort: the error that made this
    /// necessary is the one reported), the last written first.
    async fn put_back(self, client: &CriClient) {
        let mut images = ImagesClient::new(client.channel());
        for before in self.0.into_iter().rev() {
            let name = before.name.clone();
            let now = match record_labels(client, &name).await {
                Ok(Some(labels)) => labels,
                _ => continue,
            };
            let changes: BTreeMap<String, Option<String>> = now
                .keys()
                .chain(before.labels.keys())
                .filter(|key| now.get(*key) != before.labels.get(*key))
                .map(|key| (key.clone(), before.labels.get(key).cloned()))
                .collect();
            let mut current = before;
            current.labels = now;
            if let Err(status) = images
                .update(namespaced(label_update(&current, &changes)))
                .await
            {
                tracing::warn!("{name}: putting its labels back: {}", status.message());
            }
        }
    }

    /// Runs `writes`, putting back what it changed when it fails.
    async fn or_put_back<T>(
        client: &CriClient,
        writes: impl AsyncFnOnce(&mut Written) -> Result<T, PinError>,
    ) -> Result<T, PinError> {
        let mut written = Written::default();
        let result = writes(&mut written).await;
        if result.is_err() {
            written.put_back(client).await;
        }
        result
    }
}

/// Makes every record of `image` say `holders` (the pin label with them), then reads the records back:
/// proof it was written, since containerd 1.6 does not report pins through CRI. Each record changed goes
/// into `written`.
async fn write_holders(
    client: &CriClient,
    image: &ContainerdImage,
    holders: &Holders,
    written: &mut Written,
) -> Result<(), PinError> {
    let mut images = ImagesClient::new(client.channel());
    for record in &image.records {
        let name = &record.name;
        let changes = label_changes(&record.labels, holders);
        if changes.is_empty() {
            continue;
        }
        let update = label_update(record, &changes);
        match images.update(namespaced(update)).await {
            // Removed meanwhile: nothing left to label.
            Err(status) if status.code() == tonic::Code::NotFound => continue,
            Err(status) => return Err(containerd_error("Update", name, &status)),
            Ok(_) => written.0.push(record.clone()),
        }
        let back = record_labels(client, name).await?.unwrap_or_default();
        if !label_changes(&back, holders).is_empty() {
            return Err(PinError::Containerd(format!(
                "{name}: its labels say {:?} after the update, not {:?}",
                label_holders(&back),
                holders
            )));
        }
    }
    Ok(())
}

/// What holding images on containerd did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The containerd records labelled, per image in the order given.
    pub records: Vec<Vec<String>>,
    /// Whether CRI reports every image pinned (containerd >= 1.6.22 / 1.7.3).
    pub confirmed: bool,
}

/// Adds each image's sets to who holds its pin, on every containerd record of the image, with the pin
/// label. A pin already there without holders (an earlier pinboard's, or someone else's) is adopted: it
/// stays unowned beside the sets. Fails naming an image the node does not have; a failure puts back every
/// label written before it.
pub async fn hold_containerd(
    client: &CriClient,
    holds: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Held, PinError> {
    let images = containerd_images(client).await?;
    Written::or_put_back(client, async |written: &mut Written| {
        let mut held = Held {
            records: Vec::new(),
            confirmed: true,
        };
        for (reference, sets) in holds {
            let not_there = || {
                PinError::Containerd(format!("{reference} is not on the node: nothing to label"))
            };
            let status = client
                .image_status(reference)
                .await?
                .ok_or_else(not_there)?;
            let image =
                image_named(&images, &cri_names(reference, &status)).ok_or_else(not_there)?;
            let mut holders = image.holders();
            holders.extend(sets.iter().map(|s| Holder::Set(s.clone())));
            write_holders(client, image, &holders, written).await?;
            held.records.push(image.names());
            held.confirmed &= client
                .image_status(reference)
                .await?
                .is_some_and(|i| i.pinned);
        }
        Ok(held)
    })
    .await
}

/// Applies `release` to every image of the node: each loses the released holders, and its pin label with
/// the last one. What happened to each image concerned; a failure puts back every label changed before it.
pub async fn release_containerd(
    client: &CriClient,
    release: &ReleaseScope,
) -> Result<Vec<PinChange>, PinError> {
    let images = containerd_images(client).await?;
    Written::or_put_back(client, async |written: &mut Written| {
        let mut changes = Vec::new();
        for image in &images {
            let Some(change) = release.change(&image.shown(), &image.holders(), &image.names())
            else {
                continue;
            };
            if change.after != change.before {
                write_holders(client, image, &change.after, written).await?;
            }
            changes.push(change);
        }
        Ok(changes)
    })
    .await
}

/// The labels of the containerd image record `name` (None: no such record).
pub async fn record_labels(
    client: &CriClient,
    name: &str,
) -> Result<Option<HashMap<String, String>>, PinError> {
    match ImagesClient::new(client.channel())
        .get(namespaced(GetImageRequest { name: name.into() }))
        .await
    {
        Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
        Err(status) => Err(containerd_error("Get", name, &status)),
        Ok(reply) => Ok(reply.into_inner().image.map(|i| i.labels)),
    }
}

fn containerd_error(rpc: &str, name: &str, status: &tonic::Status) -> PinError {
    PinError::Containerd(format!(
        "{rpc} {name}: {} ({:?})",
        status.message(),
        status.code()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str) -> Holder {
        Holder::Set(name.into())
    }

    #[test]
    fn a_label_update_carries_the_record_whole_and_masks_only_the_changed_labels() {
        let target = crate::backend::proto::containerd_types::Descriptor {
            media_type: "application/vnd.oci.image.manifest.v1+json".into(),
            digest: "sha256:aa".into(),
            size: 428,
            annotations: HashMap::new(),
        };
        let record = ContainerdRecord {
            name: "reg.example.com/app@sha256:aa".into(),
            labels: HashMap::from([
                ("io.cri-containerd.image".into(), "managed".into()),
                ("pinboard.dev/set.old".into(), "old".into()),
            ]),
            target: Some(target.clone()),
            ..ContainerdRecord::default()
        };
        let changes = BTreeMap::from([
            ("pinboard.dev/set.old".to_string(), None),
            (
                CONTAINERD_PIN_LABEL.to_string(),
                Some(CONTAINERD_PIN_VALUE.to_string()),
            ),
        ]);
        let update = label_update(&record, &changes);
        let image = update.image.unwrap();
        assert_eq!(image.target, Some(target), "the target is required");
        assert_eq!(image.name, record.name);
        assert_eq!(
            image.labels,
            HashMap::from([
                ("io.cri-containerd.image".into(), "managed".into()),
                (CONTAINERD_PIN_LABEL.into(), CONTAINERD_PIN_VALUE.into()),
            ])
        );
        assert_eq!(
            update.update_mask.unwrap().paths,
            [
                "labels.io.cri-containerd.pinned",
                "labels.pinboard.dev/set.old"
            ]
        );
    }

    #[test]
    fn holder_labels_fit_containerd_and_kubernetes_and_hash_long_names() {
        assert_eq!(set_label("release-4.19"), "pinboard.dev/set.release-4.19");
        let long = format!("release-{}", "x".repeat(60));
        let hashed = set_label(&long);
        assert!(hashed.starts_with("pinboard.dev/set-sha256."), "{hashed}");
        assert_eq!(hashed.split('/').nth(1).unwrap().len(), 51);
        assert_ne!(set_label(&format!("{long}y")), hashed);
        // Every key's name part is a Kubernetes label name: at most 63 characters.
        for name in ["a", &"b".repeat(59), &"c".repeat(60), &"d".repeat(253)] {
            assert!(
                set_label(name).split('/').nth(1).unwrap().len() <= 63,
                "{name}"
            );
        }
    }

    #[test]
    fn labels_say_who_holds_and_keep_the_pin_while_anyone_does() {
        let labels = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let long = "l".repeat(70);
        let pinned = (CONTAINERD_PIN_LABEL, CONTAINERD_PIN_VALUE);
        let held = labels(&[
            pinned,
            ("pinboard.dev/set.set-a", "set-a"),
            (&set_label(&long), &long),
            ("other.io/keep", "x"),
        ]);
        assert_eq!(
            label_holders(&held),
            Holders::from([set("set-a"), set(&long)])
        );
        // A pin label nobody recorded: unowned. Holding it adopts it beside the set.
        let foreign = labels(&[pinned]);
        assert_eq!(label_holders(&foreign), Holders::from([Holder::Unowned]));
        let adopted = label_changes(&foreign, &Holders::from([Holder::Unowned, set("set-a")]));
        assert_eq!(
            adopted,
            BTreeMap::from([
                (
                    "pinboard.dev/set.set-a".to_string(),
                    Some("set-a".to_string())
                ),
                (UNOWNED_LABEL.to_string(), Some("adopted".to_string())),
            ])
        );
        // Releasing one set keeps the pin; the last one takes the pin label; other labels stay.
        let one_left = label_changes(&held, &Holders::from([set(&long)]));
        assert_eq!(
            one_left,
            BTreeMap::from([("pinboard.dev/set.set-a".to_string(), None)])
        );
        let none_left = label_changes(&held, &Holders::new());
        assert_eq!(none_left.len(), 3, "{none_left:?}");
        assert!(none_left.values().all(Option::is_none));
        assert!(!none_left.contains_key("other.io/keep"));
        assert!(label_changes(&held, &label_holders(&held)).is_empty());
    }
}
