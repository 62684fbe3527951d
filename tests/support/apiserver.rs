//! A real Kubernetes API server for the lab: etcd plus the kube-apiserver that scripts/setup builds, with
//! token authentication (an admin in `system:masters` and a `viewer` with no groups, for RBAC tests) and an
//! admin kubeconfig. Files live in `<lab>/apiserver/`, logs in `<lab>/etcd.log` and
//! `<lab>/kube-apiserver.log`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Result, bail};

use super::http;
use super::process::{Proc, free_port, run};

#[derive(Debug)]
pub struct ApiServer {
    url: String,
    kubeconfig: PathBuf,
    admin_token: String,
    viewer_token: String,
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

    /// Starts etcd and kube-apiserver (each added to `procs` before it is waited on) and returns once
    /// `/readyz` answers 200 to the admin.
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
        let mut apiserver = Command::new(&binary);
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!("--secure-port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--insecure-port=0",
            ])
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!("--token-auth-file={}", tokens.display()))
            .arg("--authorization-mode=RBAC")
            .arg(format!("--service-account-key-file={}", sa_pub.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_key.display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg("--service-cluster-ip-range=10.0.0.0/24");
        procs.push(Proc::spawn(
            "kube-apiserver",
            apiserver,
            &lab_dir.join("kube-apiserver.log"),
        )?);
        let readyz = format!("{url}/readyz");
        procs
            .last_mut()
            .expect("just pushed")
            .wait_ready(Duration::from_secs(120), || {
                http::probe(&agent, &readyz, Some(&admin_token)) == Some(200)
            })?;

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
        Ok(ApiServer {
            url,
            kubeconfig,
            admin_token,
            viewer_token,
        })
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
