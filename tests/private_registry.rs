//! Private images end to end, against a registry that authenticates as quay.io and Docker Hub do: the lab's
//! docker-registry with `auth: token` behind the lab's token service (RS256 JWTs, scopes per repository),
//! three real containerd nodes, and an auth file holding a user's password for the registry and an identity
//! token for one repository.
//!
//! - Without the auth file, `plan` exits 2 naming each private image and the missing credentials; the
//!   public image is not among them.
//! - With it, `plan`, `apply` and `check` succeed, and every node holds every image with the pin label:
//!   the credentials reached containerd (its token requests are in the token service's log: the password
//!   grant and the refresh-token grant, both by POST, as containerd sends them).
//! - With `PINBOARD_LOG=debug`, neither the password, its base64, the identity token nor any token the
//!   service issued appears in stdout or stderr.

mod support;

use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};
use support::{
    ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, RegistrySetup, Run, TokenConfig,
    TokenUser, isolated, pinboard_with,
};

const MI: u64 = 1 << 20;
const USER: &str = "alice";
const PASSWORD: &str = "alice-s3cret-pass";
const IDENTITY_TOKEN: &str = "robot-identity-token-7f3a";

fn image(lab: &Lab, repo: &str, seed: u64) -> String {
    let spec = ImageSpec {
        layers: vec![
            LayerSpec {
                seed: 1200,
                bytes: 96 * 1024,
                format: LayerFormat::Gzip,
            },
            LayerSpec {
                seed,
                bytes: 48 * 1024,
                format: LayerFormat::Gzip,
            },
        ],
        ..ImageSpec::default()
    };
    lab.push_image(repo, &spec)
        .expect("push")
        .reference(&lab.proxy_host())
}

fn run(home: &Path, args: &[String], env: &[(&str, &str)]) -> Run {
    pinboard_with(args, |command| {
        isolated(home)(command);
        command.envs(env.iter().copied());
    })
}

#[test]
fn private_images_are_planned_applied_and_pinned_with_the_auth_file_which_never_leaks() {
    let mut robot = TokenUser::new("robot", "robot-unused-password", &["private/robot"]);
    robot.identity_token = Some(IDENTITY_TOKEN.into());
    let lab = Lab::start(
        "private-registry",
        LabConfig {
            nodes: ["n1", "n2", "n3"]
                .iter()
                .map(|n| NodeSpec::new(n, 32 * MI))
                .collect(),
            registry: RegistrySetup {
                tokens: Some(TokenConfig {
                    users: vec![TokenUser::new(USER, PASSWORD, &["private/*"]), robot],
                    public: vec!["public/*".into()],
                }),
                ..RegistrySetup::default()
            },
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let proxy = lab.proxy_host();
    let app = image(&lab, "private/app", 1201);
    let robot_image = image(&lab, "private/robot", 1202);
    let tools = image(&lab, "public/tools", 1203);

    let home = tempfile::tempdir().unwrap();
    let mut common: Vec<String> = vec!["--insecure-registry".into(), proxy.clone()];
    for node in lab.nodes() {
        common.push("--cri".into());
        common.push(format!("{}={}", node.name, node.endpoint()));
    }
    for reference in [&app, &robot_image, &tools] {
        common.push("--image".into());
        common.push(reference.clone());
    }
    common.extend(["--min-free".into(), "1Mi".into()]);
    let args = |command: &str, extra: &[&str]| -> Vec<String> {
        let mut args = vec![command.to_string()];
        args.extend(common.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };

    // No auth file anywhere: exit 2, one line per private image, naming what is missing.
    let denied = run(home.path(), &args("plan", &[]), &[]);
    assert_eq!(denied.code, 2, "{}{}", denied.stdout, denied.stderr);
    for private in [&app, &robot_image] {
        assert!(
            denied.stderr.contains(&format!(
                "registry {proxy} refused access to {private} (no credentials found for it: no auth file was found)"
            )),
            "{}",
            denied.stderr
        );
    }
    assert!(
        denied.stderr.contains("or pass --authfile"),
        "{}",
        denied.stderr
    );
    assert!(
        !denied.stderr.contains(&tools),
        "the public image needs none: {}",
        denied.stderr
    );
    assert!(denied.stdout.is_empty(), "{}", denied.stdout);

    // The auth file: a password for the registry, an identity token for one repository.
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let authfile = home.path().join("auth.json");
    std::fs::write(
        &authfile,
        json!({"auths": {
            (proxy.clone()): {"auth": encoded},
            (format!("{proxy}/private/robot")): {"identitytoken": IDENTITY_TOKEN},
        }})
        .to_string(),
    )
    .unwrap();
    let authfile = authfile.display().to_string();
    let debug = [("PINBOARD_LOG", "debug")];

    let plan = run(
        home.path(),
        &args("plan", &["--authfile", &authfile, "-o", "json"]),
        &debug,
    );
    assert_eq!(plan.code, 0, "{}{}", plan.stdout, plan.stderr);
    let planned: Value = serde_json::from_str(&plan.stdout).unwrap();
    for node in planned["nodes"].as_array().unwrap() {
        let images = node["images"].as_array().unwrap();
        assert_eq!(images.len(), 3, "{node}");
        assert!(
            images.iter().all(|i| i["fetchBytes"].as_u64() > Some(0)),
            "{node}"
        );
        assert_eq!(node["verdict"], "fits", "{node}");
    }

    let apply = run(
        home.path(),
        &args("apply", &["--authfile", &authfile]),
        &debug,
    );
    assert_eq!(apply.code, 0, "{}{}", apply.stdout, apply.stderr);
    let check = run(
        home.path(),
        &args("check", &["--authfile", &authfile]),
        &debug,
    );
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);

    // Present and pinned, as containerd itself lists them.
    for node in lab.nodes() {
        let listed = node.images_ls();
        for reference in [&app, &robot_image, &tools] {
            let line = listed
                .lines()
                .find(|l| l.starts_with(reference.as_str()))
                .unwrap_or_else(|| panic!("{}: {reference} missing:\n{listed}", node.name));
            assert!(
                line.contains("io.cri-containerd.pinned=pinned"),
                "{}: {line}",
                node.name
            );
        }
    }

    // The credentials reached the runtimes: containerd asks for tokens by POST (the password grant for the
    // user, the refresh-token grant for the identity token), pinboard by GET and the refresh-token grant.
    let requests = lab.token_service().unwrap().requests();
    let granted = |method: &str, grant: &str, user: &str| {
        requests
            .iter()
            .filter(|r| {
                r.method == method
                    && r.grant == grant
                    && r.user.as_deref() == Some(user)
                    && r.status == 200
            })
            .count()
    };
    assert!(
        granted("POST", "password", USER) >= 3,
        "one per node at least: {requests:?}"
    );
    assert!(
        granted("POST", "refresh_token", "robot") >= 4,
        "pinboard and each node: {requests:?}"
    );
    assert!(granted("GET", "basic", USER) >= 1, "{requests:?}");

    // Nothing secret in any output, with debug logging on.
    assert!(
        plan.stderr.contains("DEBUG"),
        "debug logging was on:\n{}",
        plan.stderr
    );
    let issued = lab.token_service().unwrap().issued();
    assert!(issued.len() >= 8, "{}", issued.len());
    let mut secrets = vec![
        PASSWORD.to_string(),
        encoded.clone(),
        IDENTITY_TOKEN.to_string(),
    ];
    for token in &issued {
        secrets.push(token.clone());
        // The signature alone, should a log cut the token.
        secrets.push(token.rsplit('.').next().unwrap().to_string());
    }
    for (name, output) in [("plan", &plan), ("apply", &apply), ("check", &check)] {
        for secret in &secrets {
            for (stream, text) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
                assert!(
                    !text.contains(secret.as_str()),
                    "{name} {stream} holds a secret:\n{text}"
                );
            }
        }
    }
}
