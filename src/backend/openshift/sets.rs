//! Writing PinnedImageSets: server-side apply with field manager `pinboard` (create and edit alike), and
//! delete; lazy pulling per pool through a ContainerRuntimeConfig; and whether this account may write at
//! all. A 403 becomes [`ClusterError::ReadOnly`].

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use serde_json::json;

use super::{Cluster, ClusterError, typed};
use crate::model::machine_config::{PinnedImageSet, lazy_config_name, pool_label};
use crate::model::set::API_GROUP;
use crate::model::set::ImageSet;

/// The field manager pinboard's writes are recorded under.
pub const FIELD_MANAGER: &str = "pinboard";

impl Cluster {
    fn sets_api(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &self.resources.pinned_image_set)
    }

    /// Creates the set or makes it exactly `set` (name, labels, images): pinboard takes ownership of the
    /// fields it writes (a forced apply), as the user asked for this content. Refuses a set that breaks
    /// PinnedImageSet's rules before sending anything. Returns the set as stored.
    pub async fn apply_set(&self, set: &ImageSet) -> Result<PinnedImageSet, ClusterError> {
        let problems = set.validate();
        if !problems.is_empty() {
            return Err(ClusterError::Invalid {
                name: set.name.clone(),
                problems,
            });
        }
        let resource = &self.resources.pinned_image_set;
        let body = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"name": set.name, "labels": set.labels},
            "spec": {"pinnedImages": set.references().map(|name| json!({"name": name})).collect::<Vec<_>>()},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let stored = self
            .sets_api()
            .patch(&set.name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| refused(e, "apply", &set.name))?;
        Ok(typed(&stored).unwrap_or_default())
    }

    /// Deletes the set; nodes keep the images, and unpin them.
    pub async fn delete_set(&self, name: &str) -> Result<(), ClusterError> {
        self.sets_api()
            .delete(name, &DeleteParams::default())
            .await
            .map_err(|e| refused(e, "delete", name))?;
        Ok(())
    }
}

impl Cluster {
    /// Turns lazy pulling on for `pool` (a ContainerRuntimeConfig `pinboard-lazy-<pool>` selecting the pool
    /// by its `pools.operator.machineconfiguration.openshift.io/<pool>` label, with `store` as its
    /// additional layer store), or off (deleting that config; a config pinboard did not write stays).
    pub async fn set_lazy(
        &self,
        pool: &str,
        store: &str,
        enable: bool,
    ) -> Result<(), ClusterError> {
        let resource = &self.resources.runtime_config;
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let name = lazy_config_name(pool);
        if !enable {
            return match api.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                other => other.map(|_| ()).map_err(|e| refused(e, "delete", &name)),
            };
        }
        let body = json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"name": name},
            "spec": {
                "machineConfigPoolSelector": {"matchLabels": {pool_label(pool): ""}},
                "containerRuntimeConfig": {"additionalLayerStores": [{"path": store}]},
            },
        });
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| refused(e, "apply", &name))?;
        Ok(())
    }

    /// Whether this account may write PinnedImageSets (a SelfSubjectAccessReview for `patch`); the reason
    /// when not.
    pub async fn write_denied(&self) -> Option<String> {
        let review: SelfSubjectAccessReview = serde_json::from_value(json!({
            "spec": {"resourceAttributes": {
                "group": API_GROUP, "resource": self.resources.pinned_image_set.plural, "verb": "patch",
            }},
        }))
        .ok()?;
        let answer = Api::<SelfSubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await;
        match answer {
            Ok(review) if review.status.as_ref().is_some_and(|s| s.allowed) => None,
            Ok(_) => Some(
                "your account may not write PinnedImageSets (bind ClusterRole pinboard-operator from \
                 deploy/rbac.yaml)"
                    .into(),
            ),
            Err(e) => Some(format!("cannot ask whether your account may write: {e}")),
        }
    }
}

/// A write's error, with 403 and 404 told plainly.
fn refused(error: kube::Error, verb: &'static str, name: &str) -> ClusterError {
    match &error {
        kube::Error::Api(status) if status.code == 403 => ClusterError::ReadOnly {
            verb,
            message: status.message.clone(),
        },
        kube::Error::Api(status) if status.code == 404 => ClusterError::NoSuchSet(name.to_owned()),
        _ => ClusterError::Api(error),
    }
}
