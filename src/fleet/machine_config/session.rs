//! A connected cluster and its watched view, for the headless commands: the first complete view waited
//! for, then followed (never polled) until the sets are ready or the wait ends. Each target node's kubelet
//! configuration is read once, when the node first matters.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::super::first_list::{FailingWatch, Watched, next_update, wait_for_first_list};
use super::super::sets::unknown_sets;
use crate::backend::openshift::{Cluster, ConnectOptions, Watch, connect, watch};
use crate::error::Failure;
use crate::model::cluster_session::ClusterSession;
use crate::model::machine_config::Connection;
use crate::model::readiness::{Readiness, WantedSet};
use crate::model::set::ImageSet;

/// A cluster connected and watched.
pub(super) struct Connected {
    pub(super) cluster: Cluster,
    watch: Watch,
    pub(super) session: ClusterSession,
}

impl Watched for Connected {
    fn listed(&self) -> bool {
        self.session.view.synced()
    }

    fn failing(&self) -> Option<FailingWatch> {
        match self.session.view.connection() {
            Connection::Reconnecting { since, error } => Some(FailingWatch {
                what: "the cluster".into(),
                since,
                error,
            }),
            _ => None,
        }
    }

    async fn next_update(&mut self, deadline: Instant) -> bool {
        next_update(&mut self.watch.updates, deadline, |u| {
            self.session.apply(u);
        })
        .await
    }
}

impl Connected {
    /// Connects, discovers the machine-config kinds and waits for the first complete view; exit 3 when the
    /// API server does not answer, naming the watch that failed.
    pub(super) async fn open(options: &ConnectOptions) -> Result<Connected, Failure> {
        let cluster = Cluster::discover(connect(options).await?).await?;
        let mut connected = Connected {
            watch: watch(&cluster),
            cluster,
            session: ClusterSession::default(),
        };
        wait_for_first_list(
            &mut connected,
            "the ClusterRole pinboard-viewer (deploy/rbac.yaml)",
        )
        .await?;
        Ok(connected)
    }

    /// Reads the kubelet configuration of every node the wanted sets land on that was not read yet (a node
    /// that joins while `wait` follows the cluster is read when it appears).
    async fn read_kubelets(&mut self, wanted: &[WantedSet]) {
        let view = &self.session.view;
        let unread: BTreeSet<String> = wanted
            .iter()
            .flat_map(|w| view.nodes_of(w.labels(view)))
            .filter(|n| view.node(n).is_some() && !self.session.kubelets.contains_key(n))
            .collect();
        if !unread.is_empty() {
            let unread: Vec<String> = unread.into_iter().collect();
            let read = self.cluster.kubelet_settings(&unread).await;
            self.session.kubelets.extend(read);
        }
    }

    /// The wanted sets judged on every node they land on, now.
    pub(super) async fn readiness(&mut self, wanted: &[WantedSet]) -> Readiness {
        self.read_kubelets(wanted).await;
        self.session.readiness(wanted, SystemTime::now())
    }

    /// Follows the cluster until every node is ready or `limit` has passed, one line on stderr per change.
    pub(super) async fn wait(&mut self, wanted: &[WantedSet], limit: Duration) -> Readiness {
        let deadline = Instant::now() + limit;
        let mut last_line = String::new();
        loop {
            let readiness = self.readiness(wanted).await;
            let connection = self.session.view.connection();
            let mut line = readiness.progress_line();
            if connection != Connection::Synced {
                line.push_str(&format!(" (API server: {connection})"));
            }
            if readiness.ready {
                return readiness;
            }
            if line != last_line {
                eprintln!("waiting: {line}");
            }
            if !self.next_update(deadline).await {
                eprintln!("waiting: timed out after {limit:?}: {line}");
                return self.readiness(wanted).await;
            }
            last_line = line;
        }
    }

    /// The sets to check: those read from files, and those `names` names on the cluster (each must be there).
    pub(super) fn wanted(
        &self,
        files: Vec<ImageSet>,
        names: Vec<String>,
    ) -> Result<Vec<WantedSet>, Failure> {
        self.session
            .wanted(files, names)
            .map_err(|sets| unknown_sets(sets, "PinnedImageSet", "a PinnedImageSet YAML file"))
    }
}
