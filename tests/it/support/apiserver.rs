//! A real Kubernetes API server for the lab: etcd plus the kube-apiserver that scripts/setup builds, with
//! token authentication (an admin in `system:masters` and a `viewer` with no groups, for RBAC tests) and an
//! admin kubeconfig. Files live in `<lab>/apiserver/`, logs in `<lab>/etcd.log` and
//! `<lab>/kube-apiserver.log`. The kube-apiserver can be stopped and started again on the same port while
//! etcd (and so the data) stays, for tests of an API server outage.
//!
//! A cluster lab's API server ([`ClusterApiServer`]) runs with etcd in the lab's network namespace, on the
//! lab's address and port 443, which is also the `kubernetes` Service's ClusterIP and port, so that pods
//! reach it without kube-proxy; it serves a certificate of the cluster's CA, authenticates the kubelets'
//! client certificates from that CA and authorizes them with the Node authorizer.

use std::collections::hash_map::RandomState;
use std::ffi::OsStr;
use std::hash::{BuildHasher as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, bail};

use super::http;
use super::network::{LabNetwork, command_in};
use super::pki::Ca;
use super::process::{Proc, free_port, run, stop_all};

/// How a cluster lab's API server runs.
pub(crate) struct ClusterApiServer<'a> {
    pub(crate) network: &'a LabNetwork,
    /// Signs its serving certificate and the clients' certificates it accepts.
    pub(crate) ca: &'a Ca,
    /// ServiceAccounts (namespace, name) given a static token.
    pub(crate) service_accounts: &'a [(String, String)],
}

/// The running kube-apiserver (stopped when this is dropped, before the lab stops etcd) and how to start
/// it again.
pub struct ApiServer {
    url: String,
    etcd_url: String,
    kubeconfig: PathBuf,
    admin_token: String,
    viewer_token: String,
    /// (namespace, name, token) of the ServiceAccounts with a static token.
    service_account_tokens: Vec<(String, String, String)>,
    /// The key that signs ServiceAccount tokens.
    service_account_key: PathBuf,
    /// The network namespace it runs in (a cluster lab's).
    network_namespace: Option<PathBuf>,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// `None` while stopped.
    process: Mutex<Option<Proc>>,
}

impl ApiServer {
    /// `https://127.0.0.1:PORT`, a cluster lab's `https://10.77.N.1:443`
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// A kubeconfig for the admin: token auth, `insecure-skip-tls-verify: true` (a cluster lab's: the
    /// cluster's CA).
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

    /// (namespace, name, token) of every ServiceAccount with a static token.
    pub(crate) fn service_account_tokens(&self) -> &[(String, String, String)] {
        &self.service_account_tokens
    }

    /// The private key that signs ServiceAccount tokens (PEM), which the controller manager signs the
    /// token Secrets' tokens with.
    pub(crate) fn service_account_key(&self) -> &Path {
        &self.service_account_key
    }

    /// `http://127.0.0.1:PORT` (a cluster lab's `http://10.77.N.1:2379`) of etcd, whose v3 JSON gateway (`/v3/kv/...`) reaches the stored objects
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
        let mut command = command(self.network_namespace.as_deref(), &self.binary);
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
    /// returns once `/readyz` answers 200 to the admin; a cluster lab's as `cluster` says.
    pub(crate) fn start(
        lab_dir: &Path,
        procs: &mut Vec<Proc>,
        cluster: Option<&ClusterApiServer<'_>>,
    ) -> Result<ApiServer> {
        let apiserver = ApiServer::launch(lab_dir, procs, cluster)?;
        apiserver.wait_launched()?;
        Ok(apiserver)
    }

    /// Returns once the kube-apiserver [`ApiServer::launch`] started answers `/readyz` with 200.
    pub(crate) fn wait_launched(&self) -> Result<()> {
        let mut process = self.process.lock().unwrap_or_else(PoisonError::into_inner);
        match process.as_mut() {
            Some(process) => self.wait_ready(process),
            None => bail!("the kube-apiserver was stopped"),
        }
    }

    /// [`ApiServer::start`], returning once etcd is ready and the kube-apiserver started, without waiting
    /// for it ([`ApiServer::wait_launched`] does): what keeps trying it (a kubelet) can start meanwhile.
    pub(crate) fn launch(
        lab_dir: &Path,
        procs: &mut Vec<Proc>,
        cluster: Option<&ClusterApiServer<'_>>,
    ) -> Result<ApiServer> {
        let binary = cached_binary("kube-apiserver")?;
        let dir = lab_dir.join("apiserver");
        std::fs::create_dir_all(&dir)?;
        let agent = http::agent();
        let network_namespace = cluster.map(|c| c.network.namespace());

        // A cluster lab's network namespace is the lab's own: its ports are all free.
        let (etcd_url, peer_url) = match cluster {
            None => (
                format!("http://127.0.0.1:{}", free_port()?),
                format!("http://127.0.0.1:{}", free_port()?),
            ),
            Some(c) => {
                let ip = c.network.lab_ip();
                (format!("http://{ip}:2379"), format!("http://{ip}:2380"))
            }
        };
        let mut etcd = command(network_namespace.as_deref(), "etcd");
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
        let service_account_tokens: Vec<_> = cluster
            .map_or(&[][..], |c| c.service_accounts)
            .iter()
            .map(|(ns, name)| (ns.clone(), name.clone(), random_token(name)))
            .collect();
        let mut token_lines =
            format!("{admin_token},admin,admin,\"system:masters\"\n{viewer_token},viewer,viewer\n");
        for (ns, name, token) in &service_account_tokens {
            // What the ServiceAccount's own token would authenticate as.
            token_lines.push_str(&format!(
                "{token},system:serviceaccount:{ns}:{name},{ns}-{name},\
                 \"system:serviceaccounts,system:serviceaccounts:{ns},system:authenticated\"\n"
            ));
        }
        let tokens = dir.join("tokens.csv");
        std::fs::write(&tokens, token_lines)?;
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

        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--insecure-port=0".to_owned(),
            format!("--token-auth-file={}", tokens.display()),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
        ];
        let (url, certificate_authority) = match cluster {
            None => {
                let port = free_port()?;
                args.extend([
                    format!("--secure-port={port}"),
                    "--bind-address=127.0.0.1".to_owned(),
                    "--advertise-address=127.0.0.1".to_owned(),
                    format!("--cert-dir={}", dir.join("certs").display()),
                    "--authorization-mode=RBAC".to_owned(),
                    "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
                ]);
                (format!("https://127.0.0.1:{port}"), None)
            }
            Some(c) => {
                let ip = c.network.lab_ip();
                let (cert, key) = c.ca.sign(
                    "kube-apiserver",
                    "/CN=kube-apiserver",
                    &format!(
                        "subjectAltName=IP:{ip},DNS:kubernetes,DNS:kubernetes.default,\
                         DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n\
                         basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
                    ),
                )?;
                args.extend([
                    "--secure-port=443".to_owned(),
                    format!("--bind-address={ip}"),
                    format!("--advertise-address={ip}"),
                    format!("--tls-cert-file={}", cert.display()),
                    format!("--tls-private-key-file={}", key.display()),
                    format!("--client-ca-file={}", c.ca.cert.display()),
                    "--authorization-mode=Node,RBAC".to_owned(),
                    format!("--service-cluster-ip-range={}", c.network.service_range()),
                    "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
                    "--allow-privileged=true".to_owned(),
                ]);
                (format!("https://{ip}:443"), Some(c.ca.cert.as_path()))
            }
        };

        let kubeconfig = dir.join("kubeconfig");
        let trust = match certificate_authority {
            None => "insecure-skip-tls-verify: true".to_owned(),
            Some(ca) => format!("certificate-authority: {}", ca.display()),
        };
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\n\
                 kind: Config\n\
                 clusters:\n\
                 - name: lab\n  cluster:\n    server: {url}\n    {trust}\n\
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
            service_account_tokens,
            service_account_key: sa_key,
            network_namespace,
            binary,
            args,
            log: lab_dir.join("kube-apiserver.log"),
            process: Mutex::new(None),
        };
        *apiserver
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(apiserver.spawn()?);
        Ok(apiserver)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `${PINBOARD_CACHE:-$HOME/.cache/pinboard}`: what scripts/setup builds and fetches, outside the repository.
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("PINBOARD_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/pinboard"),
        PathBuf::from,
    )
}

/// `<cache>/bin/<name>` ([`cache_dir`]), where scripts/setup builds the Kubernetes commands and
/// containerd-stargz-grpc; an error saying so if it is missing.
pub fn cached_binary(name: &str) -> Result<PathBuf> {
    let binary = cache_dir().join("bin").join(name);
    if !binary.is_file() {
        bail!(
            "{} is missing: run scripts/setup, which builds {name} once and caches it there",
            binary.display()
        );
    }
    Ok(binary)
}

/// `program`, in the network namespace `namespace` if there is one.
fn command(namespace: Option<&Path>, program: impl AsRef<OsStr>) -> Command {
    match namespace {
        Some(namespace) => command_in(namespace, program),
        None => Command::new(program),
    }
}

/// `<user>-` and 16 random hex digits (std's randomly keyed hasher: no rand crate needed).
fn random_token(user: &str) -> String {
    format!("{user}-{:016x}", RandomState::new().build_hasher().finish())
}
