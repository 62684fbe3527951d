//! The lab registry: a real `docker-registry` (distribution 2.8) on a loopback port with filesystem storage
//! in the lab dir, and a small pusher for the distribution API (blob upload, manifest PUT).
//!
//! [`RegistrySetup`] guards it as a site would: bearer tokens from the lab's token service (`auth: token`),
//! HTTPS with a certificate from the site's own CA, and optionally client certificates from that CA. The
//! pusher then speaks HTTPS, presents the client certificate, and sends tokens it mints with the service.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::http;
use super::images::sha256_digest;
use super::pki::SitePki;
use super::process::{Proc, free_port_on};
use super::token::{ISSUER, SERVICE, TokenConfig, TokenService};

/// How the lab registry guards itself. The default is open, plain HTTP.
#[derive(Clone, Debug, Default)]
pub struct RegistrySetup {
    /// Behind the lab's token service, with these users and public repositories.
    pub tokens: Option<TokenConfig>,
    pub tls: RegistryTls,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RegistryTls {
    #[default]
    Off,
    /// HTTPS with a certificate signed by the lab's own CA (a site CA).
    SiteCa,
    /// [`RegistryTls::SiteCa`], and every client must present a certificate from that CA; nothing else
    /// is asked of them.
    ClientCertificates,
}

pub(crate) struct Registry {
    host: String,
    /// `http` or `https`.
    scheme: &'static str,
    agent: ureq::Agent,
    tokens: Option<Arc<TokenService>>,
    /// Blobs pushed so far, each with a repository that has it, so a blob is uploaded once per lab and
    /// mounted into other repositories.
    blobs: Mutex<HashMap<String, String>>,
}

impl Registry {
    /// Starts `docker-registry serve` on a free port of `ip` (loopback, or a cluster lab's host-side
    /// address) with its config, storage and `registry.log` in `dir`, guarded by `tokens` and `pki` as `tls`
    /// says; the process is added to `procs` before it is waited on, so it is stopped even if it never
    /// becomes ready.
    pub(crate) fn start(
        dir: &Path,
        ip: IpAddr,
        procs: &mut Vec<Proc>,
        tokens: Option<Arc<TokenService>>,
        tls: RegistryTls,
        pki: Option<&SitePki>,
    ) -> Result<Registry> {
        let host = SocketAddr::new(ip, free_port_on(ip)?).to_string();
        let storage = dir.join("registry");
        std::fs::create_dir_all(&storage)?;
        let (scheme, tls_config, agent) = match (tls, pki) {
            (RegistryTls::Off, _) => ("http", String::new(), http::agent()),
            (_, None) => bail!("a TLS registry needs the lab's CA"),
            (tls, Some(pki)) => {
                let client_cas = match tls {
                    RegistryTls::ClientCertificates => {
                        format!(", clientcas: [{}]", pki.ca.display())
                    }
                    _ => String::new(),
                };
                (
                    "https",
                    format!(
                        ", tls: {{certificate: {}, key: {}{client_cas}}}",
                        pki.server_cert.display(),
                        pki.server_key.display()
                    ),
                    http::agent_with_client_certificate(&pki.client_cert, &pki.client_key)?,
                )
            }
        };
        let auth = match &tokens {
            Some(service) => format!(
                "auth: {{token: {{realm: \"{}\", service: {SERVICE}, issuer: {ISSUER}, rootcertbundle: {}}}}}\n",
                service.realm(),
                service.cert_bundle().display()
            ),
            None => String::new(),
        };
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log: {{level: info, formatter: text}}\n\
                 storage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\n\
                 http: {{addr: {host}{tls_config}}}\n\
                 {auth}",
                storage.display()
            ),
        )?;
        let mut command = Command::new("docker-registry");
        command.arg("serve").arg(&config);
        procs.push(Proc::spawn(
            "docker-registry",
            command,
            &dir.join("registry.log"),
        )?);
        let url = format!("{scheme}://{host}/v2/");
        procs
            .last_mut()
            .expect("just pushed")
            .wait_ready(Duration::from_secs(20), || {
                matches!(http::probe(&agent, &url, None), Some(200 | 401))
            })?;
        Ok(Registry {
            host,
            scheme,
            agent,
            tokens,
            blobs: Mutex::default(),
        })
    }

    /// `IP:PORT`
    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// `http` or `https`.
    pub(crate) fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// A request with the bearer token the registry wants for `access`, when it wants one.
    fn request<B>(
        &self,
        request: ureq::RequestBuilder<B>,
        access: &[(&str, &[&str])],
    ) -> ureq::RequestBuilder<B> {
        match &self.tokens {
            Some(service) => request.header(
                "Authorization",
                format!("Bearer {}", service.mint("lab-pusher", access)),
            ),
            None => request,
        }
    }

    /// Makes `bytes` (whose digest is `digest`) available in `repo`, sending them only if needed.
    pub(crate) fn push_blob(&self, repo: &str, digest: &str, bytes: &[u8]) -> Result<()> {
        match self.start_blob(repo, digest)? {
            Some(upload) => self.finish_blob(repo, &upload, digest, bytes),
            None => Ok(()),
        }
    }

    /// Makes `digest` available in `repo` without sending it if the registry has it: nothing to do if the
    /// repository has it, a cross-repository mount if another one does. Otherwise starts an upload and
    /// returns its URL, for [`Registry::finish_blob`].
    pub(crate) fn start_blob(&self, repo: &str, digest: &str) -> Result<Option<String>> {
        let base = format!("{}://{}/v2/{repo}/blobs", self.scheme, self.host);
        let push: &[(&str, &[&str])] = &[(repo, &["pull", "push"])];
        let head = self.request(self.agent.head(format!("{base}/{digest}")), push);
        if head.call()?.status() == 200 {
            return Ok(None);
        }
        let known_in = self.blobs.lock().expect("blob map").get(digest).cloned();
        let (start_url, access) = match &known_in {
            Some(from) => (
                format!("{base}/uploads/?mount={digest}&from={from}"),
                vec![
                    (repo, &["pull", "push"][..]),
                    (from.as_str(), &["pull"][..]),
                ],
            ),
            None => (format!("{base}/uploads/"), push.to_vec()),
        };
        let started = self
            .request(self.agent.post(start_url), &access)
            .send_empty()?;
        match started.status().as_u16() {
            201 if known_in.is_some() => Ok(None), // mounted
            202 => {
                let location = started
                    .headers()
                    .get("Location")
                    .context("upload started without a Location header")?
                    .to_str()?;
                Ok(Some(if location.starts_with('/') {
                    format!("{}://{}{location}", self.scheme, self.host)
                } else {
                    location.to_owned()
                }))
            }
            status => bail!("starting blob upload to {repo}: HTTP {status}"),
        }
    }

    /// Sends the whole blob to an upload started by [`Registry::start_blob`] (a monolithic upload).
    pub(crate) fn finish_blob(
        &self,
        repo: &str,
        upload: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Result<()> {
        let separator = if upload.contains('?') { '&' } else { '?' };
        let put = self
            .agent
            .put(format!("{upload}{separator}digest={digest}"));
        let mut done = self
            .request(put, &[(repo, &["pull", "push"])])
            .header("Content-Type", "application/octet-stream")
            .send(bytes)?;
        ensure!(
            done.status() == 201,
            "blob upload of {digest} to {repo}: HTTP {}: {}",
            done.status(),
            done.body_mut().read_to_string().unwrap_or_default()
        );
        self.blobs
            .lock()
            .expect("blob map")
            .insert(digest.to_owned(), repo.to_owned());
        Ok(())
    }

    /// Stores a manifest by digest, or under `tag` when given; returns its digest.
    pub(crate) fn put_manifest_as(
        &self,
        repo: &str,
        tag: Option<&str>,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<String> {
        let digest = sha256_digest(bytes);
        let reference = tag.unwrap_or(&digest);
        let put = self.agent.put(format!(
            "{}://{}/v2/{repo}/manifests/{reference}",
            self.scheme, self.host
        ));
        let mut response = self
            .request(put, &[(repo, &["pull", "push"])])
            .header("Content-Type", media_type)
            .send(bytes)?;
        ensure!(
            response.status() == 201,
            "manifest PUT {repo}@{digest}: HTTP {}: {}",
            response.status(),
            response.body_mut().read_to_string().unwrap_or_default()
        );
        Ok(digest)
    }
}
