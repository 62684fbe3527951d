//! Writing PinnedImageSets: server-side apply with field manager `pinboard` (create and edit alike), and
//! delete. A 403 becomes [`ClusterError::ReadOnly`].

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::DynamicObject;
use serde_json::json;

use super::{Cluster, ClusterError, typed};
use crate::model::cluster::PinnedImageSet;
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
