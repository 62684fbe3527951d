//! A set as a document, in YAML (the TUI's export, `pinboard release`) or JSON: OpenShift's PinnedImageSet,
//! or pinboard's PinSet for its agents (the same `spec.pinnedImages`, plus its node selector and pull
//! Secrets). Pure, so the text can be tested and callers only write it.

use std::collections::BTreeMap;

use serde::Serialize;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::pinboard_api::{API_VERSION, SET_KIND, SecretRef};
use super::set::{API_GROUP, ImageSet, KIND};

/// Which kind a set is written as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SetKind {
    /// OpenShift's `machineconfiguration.openshift.io/v1` PinnedImageSet.
    #[default]
    PinnedImageSet,
    /// pinboard's `pinboard.dev/v1alpha1` PinSet, for its agents on any Kubernetes cluster.
    PinSet,
}

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
    #[serde(skip_serializing_if = "Option::is_none")]
    node_selector: Option<&'a LabelSelector>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pull_secrets: Vec<SecretRef>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    fan_out: bool,
}

#[derive(Serialize)]
struct Name<'a> {
    name: &'a str,
}

/// The set as a `kind` document in YAML: its name and labels, and `spec.pinnedImages[].name` in entry
/// order (a PinSet also with its node selector, pull Secrets and fan-out). The serializer quotes whatever needs
/// quoting.
pub fn set_yaml(set: &ImageSet, kind: SetKind) -> String {
    // Strings and maps of strings always serialize.
    serde_saphyr::to_string(&document(set, kind)).expect("a set serializes")
}

/// The set as a `kind` document.
pub fn document(set: &ImageSet, kind: SetKind) -> Document<'_> {
    let pin_set = kind == SetKind::PinSet;
    Document {
        api_version: match kind {
            SetKind::PinnedImageSet => format!("{API_GROUP}/v1"),
            SetKind::PinSet => API_VERSION.to_owned(),
        },
        kind: match kind {
            SetKind::PinnedImageSet => KIND,
            SetKind::PinSet => SET_KIND,
        },
        metadata: Metadata {
            name: &set.name,
            labels: (!set.labels.is_empty()).then_some(&set.labels),
        },
        spec: Spec {
            pinned_images: set.references().map(|name| Name { name }).collect(),
            node_selector: set.node_selector.as_ref().map(|s| &s.0).filter(|_| pin_set),
            pull_secrets: match pin_set {
                true => set
                    .pull_secrets
                    .iter()
                    .map(|name| SecretRef { name: name.clone() })
                    .collect(),
                false => Vec::new(),
            },
            fan_out: pin_set && set.fan_out,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::labels::{Selector, parse_selector};
    use crate::model::set::{from_flags, parse_yaml};

    #[test]
    fn a_set_written_as_a_pin_set_reads_back_with_its_selector_and_secrets_and_openshift_gets_neither()
     {
        let image = format!("r.example/app@sha256:{}", "a".repeat(64));
        let mut set = from_flags("web", std::slice::from_ref(&image));
        set.node_selector = Some(Selector(parse_selector("role=web,zone in (a,b)").unwrap()));
        set.pull_secrets = vec!["registry-login".into()];

        let pin_set = set_yaml(&set, SetKind::PinSet);
        assert!(
            pin_set.starts_with("apiVersion: pinboard.dev/v1alpha1\nkind: PinSet\n"),
            "{pin_set}"
        );
        let read = parse_yaml(&pin_set, "web.yaml").expect("pinboard reads what it writes");
        assert_eq!(read[0].node_selector, set.node_selector);
        assert_eq!(read[0].pull_secrets, set.pull_secrets);
        assert_eq!(read[0].references().collect::<Vec<_>>(), [image.as_str()]);

        let openshift = set_yaml(&set, SetKind::PinnedImageSet);
        assert!(openshift.contains("kind: PinnedImageSet"), "{openshift}");
        assert!(
            !openshift.contains("nodeSelector") && !openshift.contains("pullSecrets"),
            "OpenShift's schema has neither: {openshift}"
        );
    }

    #[test]
    fn a_fan_out_pin_set_reads_back_fanned_out_and_openshift_does_not_get_it() {
        let image = format!("r.example/app@sha256:{}", "a".repeat(64));
        let mut set = from_flags("web", std::slice::from_ref(&image));
        assert!(!set_yaml(&set, SetKind::PinSet).contains("fanOut"));
        set.fan_out = true;
        let pin_set = set_yaml(&set, SetKind::PinSet);
        assert!(pin_set.contains("fanOut: true"), "{pin_set}");
        let read = parse_yaml(&pin_set, "web.yaml").expect("pinboard reads what it writes");
        assert!(read[0].fan_out);
        assert!(!set_yaml(&set, SetKind::PinnedImageSet).contains("fanOut"));
    }
}
