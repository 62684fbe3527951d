//! The cluster's own digest mirrors: ImageDigestMirrorSets (`config.openshift.io/v1`) and the older
//! ImageContentSourcePolicies (`operator.openshift.io/v1alpha1`), which the machine-config operator renders
//! into every node's registries.conf. pinboard's registry reads in cluster mode follow them too, so a
//! disconnected cluster's `plan` and `release` reach the mirror its nodes pull from. A cluster that does not
//! serve a kind has none of it; one that forbids reading it gets a warning naming the grant.

use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};

/// The kinds read, as (group, version, kind, plural).
const KINDS: [(&str, &str, &str, &str); 2] = [
    (
        "config.openshift.io",
        "v1",
        "ImageDigestMirrorSet",
        "imagedigestmirrorsets",
    ),
    (
        "operator.openshift.io",
        "v1alpha1",
        "ImageContentSourcePolicy",
        "imagecontentsourcepolicies",
    ),
];

/// The cluster's mirror set documents (JSON, which the YAML reader takes), and what could not be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterMirrorSets {
    pub documents: Vec<String>,
    pub warnings: Vec<String>,
}

/// Lists both kinds.
pub async fn read(client: &kube::Client) -> ClusterMirrorSets {
    let mut found = ClusterMirrorSets::default();
    for (group, version, kind, plural) in KINDS {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => found.documents.extend(list.items.iter().filter_map(|object| {
                let mut value = serde_json::to_value(object).ok()?;
                value["kind"] = kind.into();
                serde_json::to_string(&value).ok()
            })),
            // Not served: not OpenShift, or too old to have the kind.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(kube::Error::Api(status)) if status.code == 403 => found.warnings.push(format!(
                "cannot read the cluster's {kind}s ({}), so their mirrors are not followed; grant `list` on \
                 {plural}.{group} (the ClusterRole pinboard-viewer in deploy/rbac.yaml has it)",
                status.message
            )),
            Err(e) => found
                .warnings
                .push(format!("cannot read the cluster's {kind}s: {e}")),
        }
    }
    found
}
