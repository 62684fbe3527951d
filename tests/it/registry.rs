//! `backend::registry` against a real registry: Debian's `docker-registry` (distribution 2.8), started per
//! test on a free 127.0.0.1 port with its own storage, and fed small images over the distribution HTTP API.
//! Self-contained on purpose (no lab; of tests/it/support, only the log capture): a plain TCP HTTP/1.1
//! client does the pushes.

use crate::support::logs::LogCapture;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::StreamExt as _;
use pinboard::backend::credentials::{AuthFiles, Credentials};
use pinboard::backend::registry::{
    BlobFailure, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_DOCKER_MANIFEST_LIST, MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST, Registry, RegistryError, RegistryOptions,
};
use pinboard::model::image::{
    ANNOTATION_ESTARGZ_TOC, ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE, ImageFacts, Layer, LazyFormat,
    Platform,
};
use pinboard::model::served::Source;
use serde_json::json;
use sha2::Digest as _;

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
const USER: &str = "pinboard";
const PASSWORD: &str = "pinboard-secret";
/// bcrypt (cost 4) of PASSWORD, for the registry's htpasswd file.
const PASSWORD_BCRYPT: &str = "$2b$04$sX9gdqICa2vfKcdnZ7uQ3.aHy1bJgtkHXwPxwydakONFsAAE7H.D2";

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

fn platform(text: &str) -> Platform {
    Platform::parse(text).unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`), enough for the distribution API.
fn http(
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Response {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// A `docker-registry serve` process with its own storage; killed by PID on drop.
struct LabRegistry {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    auth: Option<String>,
}

impl LabRegistry {
    fn start() -> Self {
        Self::start_with(false)
    }

    fn start_with(htpasswd: bool) -> Self {
        assert!(
            std::path::Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: run scripts/setup (installs Debian's docker-registry)"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog: {{level: info}}\nstorage: {{filesystem: {{rootdirectory: {}}}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
            dir.path().join("storage").display()
        );
        let mut auth = None;
        if htpasswd {
            let path = dir.path().join("htpasswd");
            std::fs::write(&path, format!("{USER}:{PASSWORD_BCRYPT}\n")).unwrap();
            config.push_str(&format!(
                "auth: {{htpasswd: {{realm: pinboard-test, path: {}}}}}\n",
                path.display()
            ));
            auth = Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let lab = LabRegistry {
            child,
            port,
            dir,
            auth,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                let status = http(port, "GET", "/v2/", &[], b"").status;
                if status == 200 || status == 401 {
                    return lab;
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not start on port {port}:\n{}",
                lab.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    fn auth_headers(&self) -> Vec<(&'static str, String)> {
        self.auth
            .iter()
            .map(|a| ("Authorization", a.clone()))
            .collect()
    }

    /// Monolithic upload: POST to open, PUT with the digest to finish.
    fn push_blob(&self, repository: &str, data: &[u8]) -> (String, u64) {
        let digest = sha256(data);
        let started = http(
            self.port,
            "POST",
            &format!("/v2/{repository}/blobs/uploads/"),
            &self.auth_headers(),
            b"",
        );
        assert_eq!(
            started.status,
            202,
            "blob upload start: {}\n{}",
            String::from_utf8_lossy(&started.body),
            self.log()
        );
        let location = started.header("Location").expect("upload location");
        let path = &location[location.find("/v2/").expect("a /v2/ location")..];
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut headers = self.auth_headers();
        headers.push(("Content-Type", "application/octet-stream".into()));
        let done = http(
            self.port,
            "PUT",
            &format!("{path}{separator}digest={digest}"),
            &headers,
            data,
        );
        assert_eq!(
            done.status,
            201,
            "blob upload: {}\n{}",
            String::from_utf8_lossy(&done.body),
            self.log()
        );
        (digest, data.len() as u64)
    }

    fn push_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> String {
        let mut headers = self.auth_headers();
        headers.push(("Content-Type", media_type.to_string()));
        let put = http(
            self.port,
            "PUT",
            &format!("/v2/{repository}/manifests/{reference}"),
            &headers,
            body,
        );
        assert_eq!(
            put.status,
            201,
            "manifest PUT: {}\n{}",
            String::from_utf8_lossy(&put.body),
            self.log()
        );
        sha256(body)
    }

    /// Config and layers as blobs, then an OCI (or Docker v2) manifest; returns the facts the registry client
    /// must report for it.
    fn push_image(&self, repository: &str, image: &TestImage, docker: bool) -> ImageFacts {
        let config = json!({"architecture": image.arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}});
        let config = serde_json::to_vec(&config).unwrap();
        let (config_digest, config_size) = self.push_blob(repository, &config);
        let mut layers = Vec::new();
        for (data, annotations) in &image.layers {
            let (digest, size) = self.push_blob(repository, data);
            layers.push(Layer {
                digest,
                media_type: if docker { DOCKER_LAYER } else { GZIP_LAYER }.into(),
                size,
                annotations: annotations.clone(),
                diff_id: None,
            });
        }
        let descriptor = |l: &Layer| {
            let mut d = json!({"mediaType": l.media_type, "digest": l.digest, "size": l.size});
            if !l.annotations.is_empty() {
                d["annotations"] = json!(l.annotations);
            }
            d
        };
        let media_type = if docker {
            MEDIA_TYPE_DOCKER_MANIFEST
        } else {
            MEDIA_TYPE_OCI_MANIFEST
        };
        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": {"mediaType": if docker { DOCKER_CONFIG } else { OCI_CONFIG }, "digest": config_digest, "size": config_size},
            "layers": layers.iter().map(descriptor).collect::<Vec<_>>(),
        });
        if !image.annotations.is_empty() {
            manifest["annotations"] = json!(image.annotations);
        }
        let body = serde_json::to_vec_pretty(&manifest).unwrap();
        let digest = self.push_manifest(repository, &sha256(&body), media_type, &body);
        ImageFacts {
            manifest_digest: digest,
            manifest_size: body.len() as u64,
            index_digest: None,
            platform: None,
            config_digest,
            config_size,
            layers,
            annotations: image.annotations.clone(),
            mirror: None,
        }
    }

    /// An index (or Docker manifest list) over already pushed manifests; returns its digest.
    fn push_index(
        &self,
        repository: &str,
        entries: &[(&ImageFacts, &str)],
        docker: bool,
    ) -> String {
        let (media_type, entry_type) = if docker {
            (MEDIA_TYPE_DOCKER_MANIFEST_LIST, MEDIA_TYPE_DOCKER_MANIFEST)
        } else {
            (MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_MANIFEST)
        };
        let manifests: Vec<_> = entries
            .iter()
            .map(|(facts, platform)| {
                let p = Platform::parse(platform).unwrap();
                let mut platform = json!({"os": p.os, "architecture": p.architecture});
                if let Some(v) = p.variant {
                    platform["variant"] = json!(v);
                }
                json!({"mediaType": entry_type, "digest": facts.manifest_digest, "size": facts.manifest_size, "platform": platform})
            })
            .collect();
        let body = serde_json::to_vec(
            &json!({"schemaVersion": 2, "mediaType": media_type, "manifests": manifests}),
        )
        .unwrap();
        self.push_manifest(repository, &sha256(&body), media_type, &body)
    }
}

impl Drop for LabRegistry {
    fn drop(&mut self) {
        // Child::kill signals exactly this PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TestImage {
    arch: &'static str,
    layers: Vec<(Vec<u8>, BTreeMap<String, String>)>,
    annotations: BTreeMap<String, String>,
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Two images sharing a layer, the first with an eStargz layer; returned as (web, api).
fn two_images() -> (TestImage, TestImage) {
    let shared = bytes(1, 3000);
    let web = TestImage {
        arch: "amd64",
        layers: vec![
            (shared.clone(), BTreeMap::new()),
            (
                bytes(2, 1234),
                annotations(&[
                    (
                        ANNOTATION_ESTARGZ_TOC,
                        "sha256:0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f",
                    ),
                    (ANNOTATION_ESTARGZ_UNCOMPRESSED_SIZE, "4096"),
                ]),
            ),
        ],
        annotations: annotations(&[("org.opencontainers.image.title", "web")]),
    };
    let api = TestImage {
        arch: "arm64",
        layers: vec![(shared, BTreeMap::new()), (bytes(3, 777), BTreeMap::new())],
        annotations: BTreeMap::new(),
    };
    (web, api)
}

fn insecure(lab: &LabRegistry) -> RegistryOptions {
    RegistryOptions {
        insecure_registries: vec![lab.host()],
        ..RegistryOptions::default()
    }
}

fn registry(options: RegistryOptions) -> Registry {
    pinboard::install_crypto_provider();
    Registry::with_credentials(options, Credentials::none()).unwrap()
}

const UNKNOWN: &str = "sha256:abababababababababababababababababababababababababababababababab";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_sizes_digests_lazy_formats_and_platforms_as_pushed() {
    let lab = LabRegistry::start();
    let host = lab.host();
    let (web_image, api_image) = two_images();
    let web = lab.push_image("app/web", &web_image, false);
    let api = lab.push_image("app/api", &api_image, false);
    lab.push_manifest("app/web", "v1", MEDIA_TYPE_OCI_MANIFEST, &{
        // The same manifest under a tag: byte-identical, so the same digest.
        let body = http(
            lab.port,
            "GET",
            &format!("/v2/app/web/manifests/{}", web.manifest_digest),
            &[("Accept", MEDIA_TYPE_OCI_MANIFEST.into())],
            b"",
        );
        assert_eq!(sha256(&body.body), web.manifest_digest);
        body.body
    });
    // A multi-platform image: the two manifests again, in their own repository, under an OCI index.
    let multi_amd64 = lab.push_image("app/multi", &web_image, false);
    let multi_arm64 = lab.push_image("app/multi", &api_image, false);
    let index = lab.push_index(
        "app/multi",
        &[(&multi_amd64, "linux/amd64"), (&multi_arm64, "linux/arm64")],
        false,
    );
    // And a Docker v2 manifest under a Docker manifest list.
    let docker = lab.push_image("app/docker", &api_image, true);
    let list = lab.push_index("app/docker", &[(&docker, "linux/arm64/v8")], true);

    let references = vec![
        format!("{host}/app/web@{}", web.manifest_digest),
        format!("{host}/app/api@{}", api.manifest_digest),
        format!("{host}/app/multi@{index}"),
        format!("{host}/app/web@{}", web.manifest_digest),
        format!("{host}/app/web@{UNKNOWN}"),
        format!("{host}/app/docker@{list}"),
    ];
    let platforms = [platform("linux/amd64"), platform("linux/arm64")];
    let registry = registry(insecure(&lab));
    let results = registry.inspect_all(&references, &platforms).await;
    assert_eq!(results.len(), references.len());

    // A plain manifest: the same facts for every platform asked, exactly as pushed.
    let got_web = results[0].as_ref().unwrap();
    assert_eq!(
        got_web,
        &vec![
            (platforms[0].clone(), web.clone()),
            (platforms[1].clone(), web.clone())
        ]
    );
    assert_eq!(got_web[0].1.lazy_format(), LazyFormat::Estargz);
    assert_eq!(got_web[0].1.layers[1].uncompressed_size(), Some(4096));
    let got_api = results[1].as_ref().unwrap();
    assert_eq!(got_api[0].1, api);
    assert_eq!(got_api[0].1.lazy_format(), LazyFormat::None);
    assert_eq!(
        got_api[0].1.layers[0].digest, web.layers[0].digest,
        "the shared layer"
    );

    // The index, resolved per platform.
    let got_multi = results[2].as_ref().unwrap();
    let expect = |facts: &ImageFacts, p: &str| ImageFacts {
        index_digest: Some(index.clone()),
        platform: Some(platform(p)),
        ..facts.clone()
    };
    assert_eq!(
        got_multi,
        &vec![
            (platforms[0].clone(), expect(&multi_amd64, "linux/amd64")),
            (platforms[1].clone(), expect(&multi_arm64, "linux/arm64")),
        ]
    );
    assert_eq!(got_multi[0].1.lazy_format(), LazyFormat::Estargz);
    assert_eq!(got_multi[1].1.lazy_format(), LazyFormat::None);

    // The duplicate reference, answered in its place.
    assert_eq!(results[3], results[0]);

    // An unknown digest.
    let err = results[4].as_ref().unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "manifest {} does not exist in registry {host}",
            references[4]
        )
    );

    // The Docker list has only arm64/v8: linux/arm64 takes it, linux/amd64 is missing.
    let err = results[5].as_ref().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} has no image for platform linux/amd64; its index offers linux/arm64/v8",
            references[5]
        )
    );
    let got_docker = registry
        .inspect(&references[5], &[platform("linux/arm64")])
        .await
        .unwrap();
    assert_eq!(got_docker[0].1.layers, docker.layers);
    assert_eq!(got_docker[0].1.manifest_digest, docker.manifest_digest);
    assert_eq!(got_docker[0].1.platform, Some(platform("linux/arm64/v8")));
    assert_eq!(got_docker[0].1.index_digest, Some(list.clone()));

    // Requests: web, api, the index and its 2 manifests, the unknown digest, the list, its manifest; the
    // duplicate and the second look at the list were served from the cache.
    assert_eq!(registry.manifest_requests(), 8);
    let again = registry.inspect(&references[0], &platforms).await.unwrap();
    assert_eq!(&again, got_web);
    let again = registry
        .inspect(&references[2], &[platform("linux/arm64")])
        .await
        .unwrap();
    assert_eq!(again[0].1.manifest_digest, multi_arm64.manifest_digest);
    assert_eq!(
        registry.manifest_requests(),
        8,
        "cached digests are not fetched again"
    );

    // A tag is resolved (not cached: tags move) and yields the digest it points at.
    let tagged = registry
        .inspect(&format!("{host}/app/web:v1"), &[platform("linux/amd64")])
        .await
        .unwrap();
    assert_eq!(tagged[0].1, web);
    assert_eq!(registry.manifest_requests(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn results_keep_input_order_under_concurrency() {
    let lab = LabRegistry::start();
    let host = lab.host();
    let (web_image, api_image) = two_images();
    let web = lab.push_image("app/web", &web_image, false);
    let api = lab.push_image("app/api", &api_image, false);
    let references: Vec<String> = (0..40)
        .map(|i| match i % 3 {
            0 => format!("{host}/app/web@{}", web.manifest_digest),
            1 => format!("{host}/app/api@{}", api.manifest_digest),
            _ => format!("{host}/app/gone{i}@{UNKNOWN}"),
        })
        .collect();
    let registry = registry(RegistryOptions {
        concurrency: 3,
        ..insecure(&lab)
    });
    let results = registry
        .inspect_all(&references, &[platform("linux/amd64")])
        .await;
    for (i, (reference, result)) in references.iter().zip(&results).enumerate() {
        match i % 3 {
            0 => assert_eq!(result.as_ref().unwrap()[0].1, web, "{i}"),
            1 => assert_eq!(result.as_ref().unwrap()[0].1, api, "{i}"),
            _ => assert_eq!(
                result.as_ref().unwrap_err().reference(),
                Some(reference.as_str()),
                "{i}"
            ),
        }
    }
    // Two digests fetched once each, and every distinct unknown reference once.
    assert_eq!(registry.manifest_requests(), 2 + 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_are_classified_with_actionable_messages() {
    let lab = LabRegistry::start();
    let host = lab.host();
    let (web_image, _) = two_images();
    let web = lab.push_image("app/web", &web_image, false);
    let reference = format!("{host}/app/web@{}", web.manifest_digest);

    // Plain HTTP only for registries named insecure: over HTTPS the handshake fails, with the fix.
    let https_only = registry(RegistryOptions::default());
    let err = https_only
        .inspect(&reference, &[platform("linux/amd64")])
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Unreachable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "cannot reach registry {host} for {reference}: TLS handshake failed"
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!("pass --insecure-registry {host}")),
        "{message}"
    );
    // One attempt, which spoke TLS and failed at the handshake: nothing was sent in the clear.
    assert_eq!(https_only.manifest_requests(), 1);

    // A closed port.
    let closed = format!("127.0.0.1:{}", free_port());
    let registry_closed = registry(RegistryOptions {
        insecure_registries: vec![closed.clone()],
        ..Default::default()
    });
    let closed_ref = format!("{closed}/app/web@{}", web.manifest_digest);
    let err = registry_closed.inspect(&closed_ref, &[]).await.unwrap_err();
    assert!(
        matches!(&err, RegistryError::Unreachable { registry, .. } if *registry == closed),
        "{err:?}"
    );
    assert!(err.to_string().contains("connection refused"), "{err}");
    // The next reference on the same registry gets its own message.
    let other = format!("{closed}/app/other@{}", web.manifest_digest);
    let err = registry_closed.inspect(&other, &[]).await.unwrap_err();
    assert_eq!(err.reference(), Some(other.as_str()));

    // A server that accepts connections and never answers them (held open until the test ends).
    let black_hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = black_hole.local_addr().unwrap().to_string();
    let _holder = std::thread::spawn(move || black_hole.incoming().collect::<Vec<_>>());
    let slow = registry(RegistryOptions {
        insecure_registries: vec![silent.clone()],
        timeout: Duration::from_secs(1),
        ..Default::default()
    });
    let started = Instant::now();
    let err = slow
        .inspect(&format!("{silent}/app/web@{}", web.manifest_digest), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Timeout { .. }), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string().contains("did not answer within 1s"),
        "{err}"
    );
    // The rest of a set on that registry fails fast instead of waiting out one timeout each.
    let other = format!("{silent}/app/other@{}", web.manifest_digest);
    let started = Instant::now();
    let err = slow.inspect(&other, &[]).await.unwrap_err();
    assert!(matches!(err, RegistryError::Timeout { .. }), "{err:?}");
    assert_eq!(err.reference(), Some(other.as_str()));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    // Not a reference at all, and a platform the image does not claim.
    let ok = registry(insecure(&lab));
    let err = ok.inspect("not a reference@@", &[]).await.unwrap_err();
    assert!(matches!(err, RegistryError::Invalid { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("not a reference@@: not a valid image reference"),
        "{err}"
    );
    let multi_amd64 = lab.push_image("app/multi", &web_image, false);
    let index = lab.push_index("app/multi", &[(&multi_amd64, "linux/amd64")], false);
    let err = ok
        .inspect(
            &format!("{host}/app/multi@{index}"),
            &[platform("linux/s390x")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RegistryError::NoPlatform { available, .. } if available == &["linux/amd64".to_string()]),
        "{err:?}"
    );
    // A digest that exists, but in another repository: not found here.
    let err = ok
        .inspect(
            &format!("{host}/app/elsewhere@{}", web.manifest_digest),
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_from_an_authfile_open_a_protected_registry() {
    let lab = LabRegistry::start_with(true);
    let host = lab.host();
    let (web_image, _) = two_images();
    let web = lab.push_image("app/web", &web_image, false);
    let reference = format!("{host}/app/web@{}", web.manifest_digest);
    let amd64 = [platform("linux/amd64")];

    let anonymous = registry(insecure(&lab));
    let err = anonymous.inspect(&reference, &amd64).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "registry {host} refused access to {reference} (no credentials found for it: no auth file \
             was found); log in with \
             `podman login {host}` or `docker login {host}`, or pass --authfile"
        )
    );

    let dir = tempfile::tempdir().unwrap();
    let authfile = |name: &str, password: &str| -> PathBuf {
        let path = dir.path().join(name);
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"));
        std::fs::write(
            &path,
            json!({"auths": {(format!("http://{host}")): {"auth": auth}}}).to_string(),
        )
        .unwrap();
        path
    };
    let good = authfile("good.json", PASSWORD);
    let with_login = Registry::with_credentials(
        insecure(&lab),
        Credentials::load(&AuthFiles::explicit(&good)).unwrap(),
    )
    .unwrap();
    let facts = with_login.inspect(&reference, &amd64).await.unwrap();
    assert_eq!(facts[0].1, web);

    // Blobs (for the blob cache) come with the same credentials, whole or from an offset; not without them.
    let source = Source {
        registry: host.clone(),
        repository: "app/web".into(),
    };
    let layer = &web.layers[0].digest;
    let (start, whole) = blob_bytes(&with_login, &source, layer, 0).await.unwrap();
    assert_eq!((start, sha256(&whole)), (0, layer.clone()));
    let (start, rest) = blob_bytes(&with_login, &source, layer, 10).await.unwrap();
    assert_eq!((start, rest.as_slice()), (10, &whole[10..]));
    let refused = blob_bytes(&anonymous, &source, layer, 0).await.unwrap_err();
    assert!(
        matches!(refused.error, RegistryError::Unauthorized { .. }),
        "{:?}",
        refused.error
    );

    // Through Registry::new and --authfile, with a wrong password: the file is named, the password never.
    let wrong_password = "wrong-password-123";
    let bad = authfile("bad.json", wrong_password);
    let with_bad = Registry::new(RegistryOptions {
        authfile: Some(bad.clone()),
        ..insecure(&lab)
    })
    .unwrap();
    let err = with_bad.inspect(&reference, &amd64).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err:?}");
    assert!(
        message.contains(&format!(
            "with the credentials from entry \"http://{host}\" of {}",
            bad.display()
        )),
        "{message}"
    );
    assert!(
        !message.contains(wrong_password) && !format!("{err:?}").contains(wrong_password),
        "{message}"
    );

    // An explicit auth file that is not JSON stops before any request.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\n  \"auths\": {\n    oops\n}").unwrap();
    let err = Registry::new(RegistryOptions {
        authfile: Some(broken.clone()),
        ..insecure(&lab)
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "auth file {} is not valid JSON at line 3: key must be a string at column 5; fix or remove it, or pass --authfile",
            broken.display()
        )
    );
}

/// Blob `digest` of `source` from byte `offset`: where the body starts in the blob, and its bytes.
async fn blob_bytes(
    registry: &Registry,
    source: &Source,
    digest: &str,
    offset: u64,
) -> Result<(u64, Vec<u8>), BlobFailure> {
    let body = registry.blob(source, digest, offset, None).await?;
    let chunks: Vec<_> = body.stream.collect().await;
    let bytes = chunks.into_iter().map(|c| c.unwrap()).collect::<Vec<_>>();
    Ok((body.start, bytes.concat()))
}

/// Everything logged (every target, TRACE) while a protected registry is used with right and wrong
/// passwords (and whatever the other tests log meanwhile): no password, in clear or base64, ever appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_never_contain_credentials() {
    let captured = LogCapture::start();

    let lab = LabRegistry::start_with(true);
    let host = lab.host();
    let (web_image, _) = two_images();
    let web = lab.push_image("app/web", &web_image, false);
    let reference = format!("{host}/app/web@{}", web.manifest_digest);
    let wrong = "another-wrong-password";
    let encode = |password: &str| {
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"))
    };
    for password in [PASSWORD, wrong] {
        let text = json!({"auths": {(host.clone()): {"auth": encode(password)}}}).to_string();
        let registry = Registry::with_credentials(
            insecure(&lab),
            Credentials::from_text("/x/auth.json", &text).unwrap(),
        )
        .unwrap();
        let result = registry
            .inspect(&reference, &[platform("linux/amd64")])
            .await;
        assert_eq!(result.is_ok(), password == PASSWORD, "{result:?}");
        // Blob requests too (the blob cache's): their Authorization header is never logged.
        let source = Source {
            registry: host.clone(),
            repository: "app/web".into(),
        };
        let blob = blob_bytes(&registry, &source, &web.layers[0].digest, 0).await;
        assert_eq!(blob.is_ok(), password == PASSWORD);
    }
    let logs = captured.text();
    assert!(
        logs.contains("fetched manifest") && logs.contains("registry request failed"),
        "{logs}"
    );
    for secret in [
        PASSWORD.to_string(),
        wrong.to_string(),
        encode(PASSWORD),
        encode(wrong),
    ] {
        assert!(
            !logs.contains(&secret),
            "the logs contain a secret:\n{logs}"
        );
    }
}
