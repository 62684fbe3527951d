//! A real Kubernetes API server for the lab: etcd plus the kube-apiserver that scripts/setup builds, with
//! token authentication (an admin in `system:masters` and a `viewer` with no groups, for RBAC tests) and an
//! admin kubeconfig. Files live in `<lab>/apiserver/`, logs in `<lab>/etcd.log` and
//! `<lab>/kube-apiserver.log`. The kube-apiserver can be stopped and started again on the same port while
//! etcd (and so the data) stays, for tests of an API server outage.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, bail};

use super::http;
use super::process::{Proc, free_port, run, stop_all};

/// The running kube-apiserver (stopped when this is dropped, before the lab stops etcd) and how to start
/// it again.
pub struct ApiServer {
    url: String,
    etcd_url: String,
    kubeconfig: PathBuf,
    admin_token: String,
    viewer_token: String,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// `None` while stopped.
    process: Mutex<Option<Proc>>,
}

impl ApiServer {
    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// A kubeconfig for the admin: token auth, `insecure-skip-tls-verify: true`.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Bearer token of user `admin` in group `system:masters`.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Bearer token of user `viewer`, in no group: RBAC grants it nothing until a test does.
    pub fn viewer_token(&self) -> &str {
        &self.viewer_token
    }

    /// `http://127.0.0.1:PORT` of etcd, whose v3 JSON gateway (`/v3/kv/...`) reaches the stored objects
    /// behind the API server's back.
    pub fn etcd_url(&self) -> String {
        self.etcd_url.clone()
    }

    /// Stops the kube-apiserver (SIGTERM, then SIGKILL after a grace period); etcd keeps running.
    pub fn stop(&self) {
        let mut process = self.process.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(process) = process.take() {
            stop_all(&mut [process]);
        }
    }

    /// Starts the kube-apiserver again, with the same port, flags, certificates and tokens, and returns
    /// once `/readyz` answers 200 to the admin. Call it on the thread that started the lab (see
    /// [`Proc::spawn`]).
    pub fn start_again(&self) -> Result<()> {
        let mut process = self.process.lock().unwrap_or_else(PoisonError::into_inner);
        if process.is_none() {
            *process = Some(self.spawn()?);
            self.wait_ready(process.as_mut().expect("just started"))?;
        }
        Ok(())
    }

    fn spawn(&self) -> Result<Proc> {
        let mut command = Command::new(&self.binary);
        command.args(&self.args);
        Proc::spawn("kube-apiserver", command, &self.log)
    }

    fn wait_ready(&self, process: &mut Proc) -> Result<()> {
        let agent = http::agent();
        let readyz = format!("{}/readyz", self.url);
        process.wait_ready(Duration::from_secs(120), || {
            http::probe(&agent, &readyz, Some(&self.admin_token)) == Some(200)
        })
    }

    /// Starts etcd (added to `procs` before it is waited on) and kube-apiserver (owned by the result) and
    /// returns once `/readyz` answers 200 to the admin.
    pub(crate) fn start(lab_dir: &Path, procs: &mut Vec<Proc>) -> Result<ApiServer> {
        let binary = kube_apiserver_binary();
        if !binary.is_file() {
            bail!(
                "{} is missing: run scripts/setup, which builds kube-apiserver once and caches it there",
                binary.display()
            );
        }
        let dir = lab_dir.join("apiserver");
        std::fs::create_dir_all(&dir)?;
        let agent = http::agent();

        let etcd_url = format!("http://127.0.0.1:{}", free_port()?);
        let peer_url = format!("http://127.0.0.1:{}", free_port()?);
        let mut etcd = Command::new("etcd");
        etcd.args(["--name", "lab", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("lab={peer_url}")]);
        procs.push(Proc::spawn("etcd", etcd, &lab_dir.join("etcd.log"))?);
        let health = format!("{etcd_url}/health");
        procs
            .last_mut()
            .expect("just pushed")
            .wait_ready(Duration::from_secs(30), || {
                http::probe(&agent, &health, None) == Some(200)
            })?;

        let admin_token = random_token("admin");
        let viewer_token = random_token("viewer");
        let tokens = dir.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!("{admin_token},admin,admin,\"system:masters\"\n{viewer_token},viewer,viewer\n"),
        )?;
        let (sa_key, sa_pub) = (dir.join("sa.key"), dir.join("sa.pub"));
        run(Command::new("openssl")
            .arg("genrsa")
            .arg("-out")
            .arg(&sa_key)
            .arg("2048"))?;
        run(Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(&sa_key)
            .arg("-out")
            .arg(&sa_pub))?;

        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            "--insecure-port=0".to_owned(),
            format!("--cert-dir={}", dir.join("certs").display()),
            format!("--token-auth-file={}", tokens.display()),
            "--authorization-mode=RBAC".to_owned(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        ];

        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\n\
                 kind: Config\n\
                 clusters:\n\
                 - name: lab\n  cluster:\n    server: {url}\n    insecure-skip-tls-verify: true\n\
                 users:\n\
                 - name: admin\n  user:\n    token: {admin_token}\n\
                 contexts:\n\
                 - name: lab\n  context:\n    cluster: lab\n    user: admin\n\
                 current-context: lab\n"
            ),
        )?;
        let apiserver = ApiServer {
            url,
            etcd_url,
            kubeconfig,
            admin_token,
            viewer_token,
            binary,
            args,
            log: lab_dir.join("kube-apiserver.log"),
            process: Mutex::new(None),
        };
        // Once `apiserver` exists, dropping it (on any error below) stops the process.
        apiserver.start_again()?;
        Ok(apiserver)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `${PINBOARD_CACHE:-$HOME/.cache/pinboard}/bin/kube-apiserver`, where scripts/setup puts it.
fn kube_apiserver_binary() -> PathBuf {
    let cache = std::env::var_os("PINBOARD_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/pinboard"),
        PathBuf::from,
    );
    cache.join("bin/kube-apiserver")
}

/// `<user>-` and 16 random hex digits (std's randomly keyed hasher: no rand crate needed).
fn random_token(user: &str) -> String {
    format!("{user}-{:016x}", RandomState::new().build_hasher().finish())
}
