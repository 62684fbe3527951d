//! A set as PinnedImageSet YAML, for the Sets screen's export: pure, so the text can be tested and the
//! backend only writes it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::set::{API_GROUP, ImageSet, KIND};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
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
    let document = Document {
        api_version: format!("{API_GROUP}/v1"),
        kind: KIND,
        metadata: Metadata {
            name: &set.name,
            labels: (!set.labels.is_empty()).then_some(&set.labels),
        },
        spec: Spec {
            pinned_images: set.references().map(|name| Name { name }).collect(),
        },
    };
    // Strings and maps of strings always serialize.
    serde_saphyr::to_string(&document).expect("a PinnedImageSet serializes")
}
