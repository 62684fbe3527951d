//! Registries signed by a site's own CA, trusted the containers way (containers-certs.d(5)): the lab's
//! docker-registry over HTTPS with a certificate from the lab's CA, and real containerd nodes whose
//! hosts.toml trust that CA (an administrator's job on real nodes).
//!
//! - Without the CA, `plan` exits 2 and says where the CA goes; with it in `--certs-dir DIR/HOST:PORT/`,
//!   in `$HOME/.config/containers/certs.d/HOST:PORT/`, or named by `SSL_CERT_FILE`, `plan` works, and
//!   `apply` and `check` too (through the token service: TLS and bearer tokens together).
//! - A registry that admits only clients with a certificate from the CA: refused with where `client.cert`
//!   and `client.key` go, then planned and applied once they are there.
//! - pinboard's registry client, as the blob cache uses it upstream, reads a blob whole from the TLS and
//!   token registry ([`support::Lab::registry_client_with`]).

use crate::support;

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use pinboard::backend::credentials::Credentials;
use pinboard::model::served::Source;
use serde_json::json;
use sha2::Digest as _;
use support::{
    ImageSpec, Lab, LabConfig, NodeSpec, PushedImage, RegistrySetup, RegistryTls, Run, TokenConfig,
    TokenUser, isolated, pinboard_with,
};

const MI: u64 = 1 << 20;

fn push(lab: &Lab, repo: &str, seed: u64) -> PushedImage {
    let spec = ImageSpec::small(seed);
    lab.push_image(repo, &spec).expect("push")
}

/// `pinboard COMMAND` on every node of the lab for `image`, in an isolated HOME, with `extra` arguments and
/// environment.
fn run(
    lab: &Lab,
    home: &Path,
    command: &str,
    image: &str,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> Run {
    let mut args: Vec<String> = vec![command.into(), "--image".into(), image.into()];
    for node in lab.nodes() {
        args.push("--cri".into());
        args.push(format!("{}={}", node.name, node.endpoint()));
    }
    args.extend(["--min-free", "1Mi"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    pinboard_with(&args, |c| {
        isolated(home)(c);
        c.envs(env.iter().copied());
    })
}

fn copy_into(dir: &Path, files: &[(&Path, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (from, name) in files {
        std::fs::copy(from, dir.join(name)).unwrap();
    }
}

#[test]
fn a_registry_signed_by_a_site_ca_is_used_once_its_ca_is_where_containers_look() {
    let lab = Lab::start(
        "site-ca",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 32 * MI), NodeSpec::new("n2", 32 * MI)],
            registry: RegistrySetup {
                tokens: Some(TokenConfig {
                    users: vec![TokenUser::new("alice", "alice-pass", &["private/*"])],
                    public: Vec::new(),
                }),
                tls: RegistryTls::SiteCa,
            },
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let proxy = lab.proxy_host();
    assert!(
        !asks_for_client_certificate(&proxy),
        "a registry that asks for no client certificate is not said to"
    );
    let pushed = push(&lab, "private/app", 1301);
    let image = pushed.reference(&proxy);
    let ca = lab.pki().unwrap().ca.clone();
    let home = tempfile::tempdir().unwrap();
    let authfile = home.path().join("auth.json");
    let encoded = base64::engine::general_purpose::STANDARD.encode("alice:alice-pass");
    let auth = json!({"auths": {(proxy.clone()): {"auth": encoded}}}).to_string();
    std::fs::write(&authfile, &auth).unwrap();
    let authfile = authfile.display().to_string();
    let certs = home.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let certs_arg = certs.display().to_string();
    let with_certs = [
        "--authfile",
        authfile.as_str(),
        "--certs-dir",
        certs_arg.as_str(),
    ];

    // The CA is nowhere pinboard looks: refused, with where it goes.
    let refused = run(&lab, home.path(), "plan", &image, &with_certs, &[]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains(&format!(
            "cannot reach registry {proxy} for {image}: TLS handshake failed (invalid peer certificate: \
             UnknownIssuer): its certificate is not signed by a CA this machine trusts (the system's CAs); \
             put the registry's CA certificate (PEM) in {certs_arg}/{proxy}/ca.crt"
        )),
        "{}",
        refused.stderr
    );
    // Without --certs-dir, the hint names the standard directories.
    let standard = run(
        &lab,
        home.path(),
        "plan",
        &image,
        &["--authfile", &authfile],
        &[],
    );
    assert_eq!(standard.code, 2, "{}", standard.stderr);
    assert!(
        standard.stderr.contains(&format!(
            "put the registry's CA certificate (PEM) in /etc/containers/certs.d/{proxy}/ca.crt (pinboard reads \
             *.crt from /etc/containers/certs.d/{proxy}, /etc/docker/certs.d/{proxy}, {}/.config/containers/certs.d/{proxy}",
            home.path().display()
        )),
        "{}",
        standard.stderr
    );

    // In --certs-dir: planned, applied, checked.
    copy_into(&certs.join(&proxy), &[(&ca, "ca.crt")]);
    for command in ["plan", "apply", "check"] {
        let done = run(&lab, home.path(), command, &image, &with_certs, &[]);
        assert_eq!(done.code, 0, "{command}: {}{}", done.stdout, done.stderr);
    }
    for node in lab.nodes() {
        let listed = node.images_ls();
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with(&image) && l.contains("io.cri-containerd.pinned=pinned")),
            "{}: {listed}",
            node.name
        );
    }

    // pinboard's registry client as other parts build on it (the blob cache's upstream fetch): TLS with the
    // site CA, a token for the user, a blob read whole and its digest right.
    let client = lab.registry_client_with(Credentials::from_text("/lab/auth.json", &auth).unwrap());
    let layer = &pushed.layers[0];
    let source = Source::of(&image).unwrap();
    let bytes = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let body = client
            .blob(&source, &layer.digest, 0, None)
            .await
            .map_err(|f| f.error)
            .unwrap();
        assert_eq!(body.start, 0);
        let chunks: Vec<_> = body.stream.collect().await;
        chunks
            .into_iter()
            .flat_map(Result::unwrap)
            .collect::<Vec<u8>>()
    });
    assert_eq!(bytes.len() as u64, layer.size);
    assert_eq!(
        format!("sha256:{:x}", sha2::Sha256::digest(&bytes)),
        layer.digest
    );

    // In the user's own certs.d, without --certs-dir.
    let user_home = tempfile::tempdir().unwrap();
    copy_into(
        &user_home
            .path()
            .join(".config/containers/certs.d")
            .join(&proxy),
        &[(&ca, "ca.crt")],
    );
    let from_home = run(
        &lab,
        user_home.path(),
        "plan",
        &image,
        &["--authfile", &authfile],
        &[],
    );
    assert_eq!(from_home.code, 0, "{}", from_home.stderr);

    // Named by SSL_CERT_FILE, which replaces the system store.
    let from_env = run(
        &lab,
        home.path(),
        "plan",
        &image,
        &["--authfile", &authfile],
        &[("SSL_CERT_FILE", &ca)],
    );
    assert_eq!(from_env.code, 0, "{}", from_env.stderr);
}

#[test]
fn a_client_certificate_registry_works_once_client_cert_and_key_are_in_the_directory() {
    let lab = Lab::start(
        "client-certs",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 32 * MI)],
            registry: RegistrySetup {
                tls: RegistryTls::ClientCertificates,
                ..RegistrySetup::default()
            },
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let proxy = lab.proxy_host();
    let image = push(&lab, "internal/app", 1302).reference(&proxy);
    let pki = lab.pki().unwrap().clone();
    let home = tempfile::tempdir().unwrap();
    let certs = home.path().join("certs");
    let dir = certs.join(&proxy);
    copy_into(&dir, &[(&pki.ca, "ca.crt")]);
    let certs_arg = certs.display().to_string();
    let args = ["--certs-dir", certs_arg.as_str()];

    assert!(
        asks_for_client_certificate(&proxy),
        "the handshake asks for one"
    );
    let refused = run(&lab, home.path(), "plan", &image, &args, &[]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains(&format!(
            "the registry asks for a client certificate; put it and its key in {0}/client.cert and \
             {0}/client.key",
            dir.display()
        )),
        "{}",
        refused.stderr
    );

    copy_into(
        &dir,
        &[
            (&pki.client_cert, "client.cert"),
            (&pki.client_key, "client.key"),
        ],
    );
    for command in ["plan", "apply", "check"] {
        let done = run(&lab, home.path(), command, &image, &args, &[]);
        assert_eq!(done.code, 0, "{command}: {}{}", done.stdout, done.stderr);
    }
}

/// What pinboard's probe finds in `endpoint`'s handshake (over TLS 1.3 the only sure sign, as the
/// registry's alert may be lost to the first request).
fn asks_for_client_certificate(endpoint: &str) -> bool {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(pinboard::backend::tls_probe::asks_for_client_certificate(
        endpoint,
        Duration::from_secs(5),
    ))
}
