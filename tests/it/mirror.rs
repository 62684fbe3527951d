//! `pinboard mirror` on its own, in front of real containerd nodes whose `hosts.toml` the test writes as an
//! administrator would (the mirror first, the source registry as `server`). The source is the lab registry
//! behind the lab proxy, so every request and byte that crosses the link is seen there. HEAD and `Range`
//! requests are sent to it over plain HTTP, as runtimes send them; private images behind the lab's token
//! registry are fetched with `--authfile`'s credentials, which appear in none of its output.

use crate::support;

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::{ImageSpec, Lab, LayerFormat, LayerSpec, NodeSpec, PushedImage};

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;

/// A `pinboard mirror` process; killed if the test ends before it is stopped.
struct Mirror {
    child: Option<Child>,
    /// `127.0.0.1:PORT`
    addr: String,
    stderr: mpsc::Receiver<String>,
}

impl Mirror {
    /// Starts `pinboard mirror --listen 127.0.0.1:0 ARGS` and waits for the line saying where it serves.
    fn start(args: &[String]) -> Mirror {
        Mirror::start_with(args, |_| {})
    }

    /// [`Mirror::start`], the command adjusted first (its environment, say).
    fn start_with(args: &[String], adjust: impl FnOnce(&mut Command)) -> Mirror {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pinboard"));
        adjust(&mut command);
        let mut child = command
            .args(["mirror", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pinboard mirror starts");
        let (send, stderr) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("mirror: {line}");
                let _ = send.send(line);
            }
        });
        let mut mirror = Mirror {
            child: Some(child),
            addr: String::new(),
            stderr,
        };
        let ready = mirror.wait_for_line("at http://");
        mirror.addr = ready
            .split("at http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("an address")
            .to_string();
        mirror
    }

    /// The next line of stderr containing `text` (lines before it are skipped).
    fn wait_for_line(&self, text: &str) -> String {
        loop {
            let line = self
                .stderr
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("pinboard mirror never said {text:?}"));
            if line.contains(text) {
                return line;
            }
        }
    }

    /// Every stderr line printed so far.
    fn stderr_so_far(&self) -> Vec<String> {
        self.stderr.try_iter().collect()
    }

    /// SIGTERM, as a service manager stops it; its exit code and stdout.
    fn stop(mut self) -> (i32, String) {
        let mut child = self.child.take().expect("running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) takes no pointers; the PID is our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = child.wait().expect("it exits");
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .expect("piped")
            .read_to_string(&mut stdout)
            .expect("stdout");
        (status.code().expect("exited, not killed"), stdout)
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn layer(seed: u64, bytes: u64) -> LayerSpec {
    LayerSpec {
        seed,
        bytes: bytes as usize,
        format: LayerFormat::Gzip,
    }
}

/// Pushes an image of gzip layers, each `(seed, bytes)`, to `repo`.
fn push(lab: &Lab, repo: &str, layers: &[(u64, u64)]) -> PushedImage {
    let spec = ImageSpec {
        layers: layers
            .iter()
            .map(|&(seed, bytes)| layer(seed, bytes))
            .collect(),
        ..ImageSpec::default()
    };
    lab.push_image(repo, &spec).expect("push")
}

/// `pinboard mirror` of `image` (a reference through the lab proxy) with the cache in `cache`.
fn mirror_of(lab: &Lab, cache: &tempfile::TempDir, image: &str) -> Mirror {
    Mirror::start(&[
        "--insecure-registry".into(),
        lab.proxy_host(),
        "--cache-dir".into(),
        cache.path().display().to_string(),
        "--image".into(),
        image.to_string(),
    ])
}

/// hosts.toml as an administrator writes it for a mirror: the mirror first, then the registry itself.
fn wire_to_mirror(lab: &Lab, mirror: &Mirror) {
    let source = lab.proxy_host();
    for node in lab.nodes() {
        std::fs::write(
            node.hosts_toml(&source),
            format!(
                "server = \"http://{source}\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                mirror.addr
            ),
        )
        .expect("hosts.toml");
    }
}

/// `pinboard apply` of `images` onto every lab node; (exit code, stdout, stderr).
fn apply(lab: &Lab, images: &[String]) -> support::Run {
    let mut args = vec!["apply".to_string()];
    for node in lab.nodes() {
        args.extend(["--cri".into(), format!("{}={}", node.name, node.endpoint())]);
    }
    for image in images {
        args.extend(["--image".into(), image.clone()]);
    }
    args.extend([
        "--insecure-registry".into(),
        lab.proxy_host(),
        "--min-free".into(),
        "1Mi".into(),
    ]);
    support::pinboard(args)
}

/// The blobs of `images` (configs and layers), each once, with their sizes.
fn unique_blobs(images: &[PushedImage]) -> Vec<(String, u64)> {
    let mut seen = BTreeSet::new();
    images
        .iter()
        .flat_map(|i| {
            std::iter::once((i.config_digest.clone(), i.config_size))
                .chain(i.layers.iter().map(|l| (l.digest.clone(), l.size)))
        })
        .filter(|(digest, _)| seen.insert(digest.clone()))
        .collect()
}

#[test]
fn mirror_serves_containerd_nodes_each_blob_crossing_once_and_refuses_other_digests() {
    let lab = Lab::with_nodes(
        "mirror",
        vec![NodeSpec::new("n1", 64 * MI), NodeSpec::new("n2", 64 * MI)],
    );
    let images: Vec<PushedImage> = (0..4u64)
        .map(|i| {
            push(
                &lab,
                &format!("mirror/app{i}"),
                &[(900, 2 * MI), (910 + i, 512 * KI)],
            )
        })
        .collect();
    let outsider = push(&lab, "mirror/outsider", &[(990, 256 * KI)]);
    let proxy = lab.proxy_host();
    let references: Vec<String> = images.iter().map(|i| i.reference(&proxy)).collect();
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--insecure-registry".to_string(),
        proxy.clone(),
        "--cache-dir".into(),
        cache.path().display().to_string(),
        "-o".into(),
        "json".into(),
    ];
    for reference in &references {
        args.extend(["--image".into(), reference.clone()]);
    }
    let mirror = Mirror::start(&args);
    wire_to_mirror(&lab, &mirror);
    let heads_before = lab.proxy().request_heads().len();

    let run = apply(&lab, &references);
    assert_eq!(
        run.code,
        0,
        "{}\n{}\nlab: {}",
        run.stdout,
        run.stderr,
        lab.dir().display()
    );
    assert!(run.stdout.contains("2/2 nodes ready"), "{}", run.stdout);

    // At the source: every blob of the sets was asked for once, by the mirror; containerd asked for none.
    let heads: Vec<String> = lab.proxy().request_heads()[heads_before..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let blobs = unique_blobs(&images);
    for (digest, _) in &blobs {
        let gets: Vec<&String> = heads
            .iter()
            .filter(|h| h.starts_with("get ") && h.contains(&format!("/blobs/{digest}")))
            .collect();
        assert_eq!(gets.len(), 1, "{digest}: {gets:?}");
        assert!(gets[0].contains("user-agent: pinboard/"), "{}", gets[0]);
    }
    assert!(
        !heads.iter().any(|h| h.contains("user-agent: containerd")),
        "containerd went to the source: {heads:?}"
    );

    // Digests outside the sets, tags and other repositories: 404, never fetched for the asker.
    let agent = support::http::agent();
    let get = |path: &str| {
        agent
            .get(format!("http://{}/v2/{path}", mirror.addr))
            .call()
            .expect("the mirror answers")
            .status()
            .as_u16()
    };
    let outsider_layer = &outsider.layers[0].digest;
    assert_eq!(
        get(&format!("mirror/app0/blobs/{outsider_layer}?ns={proxy}")),
        404
    );
    assert_eq!(
        get(&format!(
            "mirror/outsider/blobs/{outsider_layer}?ns={proxy}"
        )),
        404
    );
    assert_eq!(
        get(&format!(
            "mirror/outsider/manifests/{}?ns={proxy}",
            outsider.manifest_digest
        )),
        404
    );
    assert_eq!(
        get(&format!("mirror/app0/manifests/latest?ns={proxy}")),
        404
    );
    assert_eq!(
        get(&format!(
            "mirror/app0/blobs/{}?ns=quay.io",
            images[0].layers[1].digest
        )),
        404
    );
    // The same blob named the containers-image way (the source host as the first path segment): served.
    assert_eq!(
        get(&format!(
            "{proxy}/mirror/app0/blobs/{}",
            images[0].layers[1].digest
        )),
        200
    );
    assert_eq!(get(""), 200);
    // A node still pulls an image the mirror refuses: containerd goes on to `server`.
    let refused = apply(&lab, &[outsider.reference(&proxy)]);
    assert_eq!(refused.code, 0, "{}\n{}", refused.stdout, refused.stderr);

    let (code, stdout) = mirror.stop();
    assert_eq!(code, 0, "{stdout}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on exit");
    let blob_bytes: u64 = blobs.iter().map(|(_, size)| size).sum();
    let manifest_bytes: u64 = images.iter().map(|i| i.manifest_size).sum();
    assert_eq!(summary["images"], 4);
    assert_eq!(
        summary["linkBytes"].as_u64(),
        Some(blob_bytes + manifest_bytes),
        "each blob and manifest once: {summary}"
    );
    let served = summary["servedBytes"].as_u64().unwrap();
    let per_node: u64 = blob_bytes + manifest_bytes;
    assert!(
        served >= 2 * per_node - KI && served <= 2 * per_node + 2 * 512 * KI,
        "both nodes got every byte from the mirror: {summary}"
    );
    assert!(summary["refused"].as_u64().unwrap() >= 5, "{summary}");
}

#[test]
fn a_blob_corrupted_in_the_registry_fails_the_pull_naming_the_mismatch_and_is_not_cached() {
    let lab = Lab::with_nodes("mirror-corrupt", vec![NodeSpec::new("n1", 32 * MI)]);
    let image = push(&lab, "mirror/corrupt", &[(700, 512 * KI), (701, 128 * KI)]);
    let bad = &image.layers[0].digest;
    let stored = lab.registry_blob_file(bad);
    let mut bytes = std::fs::read(&stored).expect("the registry's copy");
    bytes[1000] ^= 0x55;
    std::fs::write(&stored, &bytes).expect("corrupt it");

    let proxy = lab.proxy_host();
    let reference = image.reference(&proxy);
    let cache = tempfile::tempdir().unwrap();
    let mirror = mirror_of(&lab, &cache, &reference);
    wire_to_mirror(&lab, &mirror);
    let run = apply(&lab, std::slice::from_ref(&reference));
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let output = format!("{}\n{}", run.stdout, run.stderr);
    assert!(
        output.contains(bad) && output.contains("digest"),
        "the pull fails naming the blob and its digest: {output}"
    );
    // The cache's first check says so; its refusal after fetching once more comes only if a client asks
    // again, and containerd, not retried on a mismatch, went on to the registry instead.
    let said = mirror.wait_for_line("blob failed verification");
    assert!(said.contains(bad), "{said}");
    let _ = mirror.stderr_so_far();
    let hex = bad.trim_start_matches("sha256:");
    for place in ["sha256", "partial"] {
        assert!(
            !cache.path().join(place).join(hex).exists(),
            "nothing of the corrupt blob stays in {place}/"
        );
    }
    let good = &image.layers[1].digest;
    assert!(
        cache
            .path()
            .join("sha256")
            .join(good.trim_start_matches("sha256:"))
            .exists(),
        "the intact layer is cached"
    );
    let (code, _) = mirror.stop();
    assert_eq!(code, 0);
}

/// `HEAD url` over a plain TCP connection: the status line and headers (lower-cased names), and whatever
/// came after them before the server closed, which must be nothing.
fn head(addr: &str, path: &str) -> (String, Vec<(String, String)>, Vec<u8>) {
    use std::io::Write as _;
    let mut stream = std::net::TcpStream::connect(addr).expect("the mirror listens");
    write!(
        stream,
        "HEAD {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .expect("the answer, then close");
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete head");
    let text = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut lines = text.lines();
    let status = lines.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, answer[end + 4..].to_vec())
}

#[test]
fn head_range_and_refused_requests_are_answered_as_a_registry_answers_them_and_counted() {
    let lab = Lab::with_nodes("mirror-head-range", Vec::new());
    let image = push(&lab, "mirror/ranged", &[(720, 768 * KI)]);
    let proxy = lab.proxy_host();
    let cache = tempfile::tempdir().unwrap();
    let mirror = mirror_of(&lab, &cache, &image.reference(&proxy));
    let layer = &image.layers[0];
    let stored = std::fs::read(lab.registry_blob_file(&layer.digest)).expect("the registry's copy");
    assert_eq!(stored.len() as u64, layer.size);
    let blob = format!("/v2/mirror/ranged/blobs/{}?ns={proxy}", layer.digest);
    let manifest = format!(
        "/v2/mirror/ranged/manifests/{}?ns={proxy}",
        image.manifest_digest
    );

    // HEAD: the size and digest, no body; for the blob, before anything is cached, and nothing fetched.
    let heads_before = lab.proxy().request_heads().len();
    for (path, digest, size) in [
        (&blob, &layer.digest, layer.size),
        (&manifest, &image.manifest_digest, image.manifest_size),
    ] {
        let (status, headers, body) = head(&mirror.addr, path);
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert!(status.starts_with("HTTP/1.1 200"), "{path}: {status}");
        assert_eq!(
            header("content-length"),
            Some(size.to_string().as_str()),
            "{path}: {headers:?}"
        );
        assert_eq!(
            header("docker-content-digest"),
            Some(digest.as_str()),
            "{path}"
        );
        assert!(body.is_empty(), "{path}: a body after HEAD: {body:?}");
    }
    let asked: Vec<String> = lab.proxy().request_heads()[heads_before..].to_vec();
    assert!(
        !asked.iter().any(|h| h.contains("/blobs/")),
        "a HEAD fetches no blob: {asked:?}"
    );

    // A range of a blob not cached yet, then of the cached blob: 206 and exactly those bytes.
    let agent = support::http::agent();
    for (first, last) in [
        (1000usize, 70_000usize),
        (300_000, 300_000),
        (700_000, 786_431),
    ] {
        let last = last.min(stored.len() - 1);
        let mut response = agent
            .get(format!("http://{}{blob}", mirror.addr))
            .header("Range", format!("bytes={first}-{last}"))
            .call()
            .expect("the mirror answers");
        assert_eq!(response.status().as_u16(), 206, "bytes={first}-{last}");
        let content_range = response
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(
            content_range.as_deref(),
            Some(format!("bytes {first}-{last}/{}", stored.len()).as_str())
        );
        let body = response.body_mut().read_to_vec().expect("the body");
        assert!(
            body == stored[first..=last],
            "bytes={first}-{last}: {} bytes, not those of the blob",
            body.len()
        );
    }
    // A range past the end: 416, saying the size.
    let response = agent
        .get(format!("http://{}{blob}", mirror.addr))
        .header("Range", format!("bytes={}-", stored.len()))
        .call()
        .expect("the mirror answers");
    assert_eq!(response.status().as_u16(), 416);
    assert_eq!(
        response
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok()),
        Some(format!("bytes */{}", stored.len()).as_str())
    );
    let fetched = lab.proxy().request_heads()[heads_before..]
        .iter()
        .filter(|h| h.to_ascii_lowercase().starts_with("get ") && h.contains(&layer.digest))
        .count();
    assert_eq!(fetched, 1, "the blob crossed the link once for all ranges");

    // Writes are 405, a tag 404: each counted as refused, with the 416 above.
    let url = |path: &str| format!("http://{}{path}", mirror.addr);
    let refusals = [
        agent.put(url(&manifest)).send_empty(),
        agent.delete(url(&blob)).call(),
        agent
            .post(url("/v2/mirror/ranged/blobs/uploads/"))
            .send_empty(),
        agent
            .get(url(&format!(
                "/v2/mirror/ranged/manifests/latest?ns={proxy}"
            )))
            .call(),
    ];
    let statuses: Vec<u16> = refusals
        .into_iter()
        .map(|r| r.expect("the mirror answers").status().as_u16())
        .collect();
    assert_eq!(statuses, [405, 405, 405, 404]);
    let (code, stdout) = mirror.stop();
    assert_eq!(code, 0);
    assert!(stdout.contains(", 5 refused\n"), "{stdout}");
}

#[test]
fn bad_input_stops_the_mirror_before_it_serves_or_asks_a_registry() {
    // Nothing listens on this registry: each refusal below comes before any request.
    let image = format!("127.0.0.1:19/app@sha256:{}", "a".repeat(64));
    let mirror = |extra: &[&str]| {
        let args = ["mirror", "--listen", "127.0.0.1:0", "--image", &image];
        support::pinboard(args.iter().chain(extra))
    };

    let run = support::pinboard([
        "mirror",
        "--listen",
        "127.0.0.1:0",
        "--image",
        "quay.io/a/b:latest",
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("quay.io/a/b:latest"), "{}", run.stderr);

    let file = tempfile::NamedTempFile::new().unwrap();
    let inside_a_file = file.path().join("cache");
    let run = mirror(&["--cache-dir", inside_a_file.to_str().unwrap()]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains(file.path().to_str().unwrap())
            && run.stderr.contains("pass another --cache-dir"),
        "{}",
        run.stderr
    );

    // Another pinboard holds the cache: refused, not shared.
    let cache = tempfile::tempdir().unwrap();
    let lock = std::fs::File::create(cache.path().join("lock")).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns; released when `lock` is dropped.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    let run = mirror(&["--cache-dir", cache.path().to_str().unwrap()]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("another pinboard process is using this cache"),
        "{}",
        run.stderr
    );
    drop(lock);
}

#[test]
fn private_blobs_are_fetched_with_the_auth_file_and_no_secret_is_printed() {
    let lab = support::private::token_lab("mirror-private", Vec::new());
    let proxy = lab.proxy_host();
    let image = push(&lab, "private/app", &[(730, 256 * KI)]);
    let home = tempfile::tempdir().unwrap();
    let authfile = support::private::auth_file(home.path(), &proxy);
    let cache = tempfile::tempdir().unwrap();
    let mut mirror = Mirror::start_with(
        &[
            "--insecure-registry".into(),
            proxy.clone(),
            "--cache-dir".into(),
            cache.path().display().to_string(),
            "--authfile".into(),
            authfile,
            "--image".into(),
            image.reference(&proxy),
        ],
        |command| {
            support::isolated(home.path())(command);
            command.env("PINBOARD_LOG", "debug");
        },
    );
    let from = lab.proxy().request_heads().len();
    // Anonymous, as a node asks: the mirror answers with what it fetched with the user's credentials.
    let agent = support::http::agent();
    let layer = &image.layers[0];
    let stored = std::fs::read(lab.registry_blob_file(&layer.digest)).expect("the registry's copy");
    for (path, size) in [
        (
            format!("manifests/{}", image.manifest_digest),
            image.manifest_size,
        ),
        (format!("blobs/{}", layer.digest), layer.size),
        (format!("blobs/{}", layer.digest), layer.size),
    ] {
        let mut response = agent
            .get(format!(
                "http://{}/v2/private/app/{path}?ns={proxy}",
                mirror.addr
            ))
            .call()
            .expect("the mirror answers");
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let body = response.body_mut().read_to_vec().expect("the body");
        assert_eq!(body.len() as u64, size, "{path}");
        if path.starts_with("blobs/") {
            assert!(body == stored, "the blob's bytes");
        }
    }
    let heads: Vec<String> = lab.proxy().request_heads()[from..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let fetched: Vec<&String> = heads
        .iter()
        .filter(|h| h.starts_with("get ") && h.contains(&layer.digest))
        .filter(|h| h.contains("authorization: bearer "))
        .collect();
    assert_eq!(fetched.len(), 1, "fetched once, with a token: {heads:?}");
    // Every line of stderr, up to the process's end.
    let lines = std::mem::replace(&mut mirror.stderr, mpsc::channel().1);
    let (code, stdout) = mirror.stop();
    let stderr = lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(code, 0);
    assert!(stderr.contains("DEBUG"), "debug logging was on");
    let run = support::Run {
        code,
        stdout,
        stderr,
    };
    support::private::assert_no_secret(&lab, &[("mirror", &run)]);
}
