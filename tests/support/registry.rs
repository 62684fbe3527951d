//! The lab registry: a real `docker-registry` (distribution 2.8) on a loopback port with filesystem storage
//! in the lab dir, and a small pusher for the distribution API (blob upload, manifest PUT).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::http;
use super::images::sha256_digest;
use super::process::{Proc, free_port};

pub(crate) struct Registry {
    host: String,
    agent: ureq::Agent,
    /// Blobs pushed so far, each with a repository that has it, so a blob is uploaded once per lab and
    /// mounted into other repositories.
    blobs: Mutex<HashMap<String, String>>,
}

impl Registry {
    /// Starts `docker-registry serve` with its config, storage and `registry.log` in `dir`; the process is
    /// added to `procs` before it is waited on, so it is stopped even if it never becomes ready.
    pub(crate) fn start(dir: &Path, procs: &mut Vec<Proc>) -> Result<Registry> {
        let host = format!("127.0.0.1:{}", free_port()?);
        let storage = dir.join("registry");
        std::fs::create_dir_all(&storage)?;
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log: {{level: info, formatter: text}}\n\
                 storage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\n\
                 http: {{addr: {host}}}\n",
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
        let agent = http::agent();
        let url = format!("http://{host}/v2/");
        procs
            .last_mut()
            .expect("just pushed")
            .wait_ready(Duration::from_secs(20), || {
                http::probe(&agent, &url, None) == Some(200)
            })?;
        Ok(Registry {
            host,
            agent,
            blobs: Mutex::default(),
        })
    }

    /// `127.0.0.1:PORT`
    pub(crate) fn host(&self) -> &str {
        &self.host
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
        let base = format!("http://{}/v2/{repo}/blobs", self.host);
        if self.agent.head(format!("{base}/{digest}")).call()?.status() == 200 {
            return Ok(None);
        }
        let known_in = self.blobs.lock().expect("blob map").get(digest).cloned();
        let start_url = match &known_in {
            Some(from) => format!("{base}/uploads/?mount={digest}&from={from}"),
            None => format!("{base}/uploads/"),
        };
        let started = self.agent.post(start_url).send_empty()?;
        match started.status().as_u16() {
            201 if known_in.is_some() => Ok(None), // mounted
            202 => {
                let location = started
                    .headers()
                    .get("Location")
                    .context("upload started without a Location header")?
                    .to_str()?;
                Ok(Some(if location.starts_with('/') {
                    format!("http://{}{location}", self.host)
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
        let mut done = self
            .agent
            .put(format!("{upload}{separator}digest={digest}"))
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

    /// PUTs a manifest or index under its own digest, which it returns.
    pub(crate) fn put_manifest(
        &self,
        repo: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<String> {
        self.put_manifest_as(repo, None, media_type, bytes)
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
        let mut response = self
            .agent
            .put(format!(
                "http://{}/v2/{repo}/manifests/{reference}",
                self.host
            ))
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
