//! A set as a PinnedImageSet document, in YAML (the TUI's export, `pinboard release`) or JSON: pure, so the
//! text can be tested and callers only write it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::set::{API_GROUP, ImageSet, KIND};

/// A PinnedImageSet as the API server stores it (the fields pinboard writes).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Document<'a> {
    api_version: String,
    kind: &'static str,
    metadata: Metadata<'a>,
    spec: Spec<'a>,
}

#[derive(Serialize)]
struct Metadata<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<&'a BTreeMap<String, String>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    pinned_images: Vec<Name<'a>>,
}

#[derive(Serialize)]
struct Name<'a> {
    name: &'a str,
}

/// `apiVersion: machineconfiguration.openshift.io/v1`, `kind: PinnedImageSet`, the set's name and labels,
/// and `spec.pinnedImages[].name` in entry order. The serializer quotes whatever needs quoting.
pub fn pinned_image_set_yaml(set: &ImageSet) -> String {
    // Strings and maps of strings always serialize.
    serde_saphyr::to_string(&document(set)).expect("a PinnedImageSet serializes")
}

/// The set as a PinnedImageSet document.
pub fn document(set: &ImageSet) -> Document<'_> {
    Document {
        api_version: format!("{API_GROUP}/v1"),
        kind: KIND,
        metadata: Metadata {
            name: &set.name,
            labels: (!set.labels.is_empty()).then_some(&set.labels),
        },
        spec: Spec {
            pinned_images: set.references().map(|name| Name { name }).collect(),
        },
    }
}
