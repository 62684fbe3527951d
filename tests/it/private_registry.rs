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
//! - A credential the token service grants only some repositories is refused for another: `plan` exits 2
//!   naming the registry, the image, the auth file's entry, the repository and what to do, and never the
//!   password or a token.
//! - A CRI-O node (the stand-in, taking credentials as CRI-O does: user and password only) pulls the image
//!   the password opens; the one only an identity token opens fails, and the reason says that CRI-O takes
//!   only a user name and password over CRI and where to put one.

use crate::support;

use std::path::Path;

use base64::Engine as _;
use pinboard::model::reference::short_reference;
use serde_json::{Value, json};
use support::private::{IDENTITY_TOKEN, SCOPED_PASSWORD, SCOPED_USER, USER, auth_file, token_lab};
use support::{
    ImageSpec, Lab, LayerFormat, LayerSpec, NodeSpec, Run, Runtime, isolated, pinboard_with,
};

const MI: u64 = 1 << 20;

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
    let nodes = ["n1", "n2", "n3"].map(|n| NodeSpec::new(n, 32 * MI));
    let lab = token_lab("private-registry", nodes.to_vec());
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

    // No auth file anywhere: exit 2, one line for both private images, naming what is missing.
    let denied = run(home.path(), &args("plan", &[]), &[]);
    assert_eq!(denied.code, 2, "{}{}", denied.stdout, denied.stderr);
    assert_eq!(denied.stderr.lines().count(), 1, "{}", denied.stderr);
    assert!(
        denied.stderr.contains(&format!(
            "registry {proxy} refused access to {app} (no credentials found for it: no auth file was found)"
        )) && denied.stderr.contains(&format!(
            "(2 images: {}, {})",
            short_reference(&app),
            short_reference(&robot_image)
        )),
        "{}",
        denied.stderr
    );
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
    let authfile = auth_file(home.path(), &proxy);
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
        node.assert_pinned(&[&app, &robot_image, &tools]);
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
    support::private::assert_no_secret(
        &lab,
        &[("plan", &plan), ("apply", &apply), ("check", &check)],
    );
}

#[test]
fn a_crio_1_33_node_pulls_with_the_password_and_is_told_what_it_cannot_use() {
    let lab = token_lab(
        "private-crio",
        vec![NodeSpec::new("n1", 64 * MI).on(Runtime::Crio133)],
    );
    let host = lab.registry_host();
    let app = image(&lab, "private/app", 1211).replace(&lab.proxy_host(), &host);
    let robot = image(&lab, "private/robot", 1212).replace(&lab.proxy_host(), &host);
    let home = tempfile::tempdir().unwrap();
    let authfile = auth_file(home.path(), &host);
    let mut args = vec!["apply".to_string()];
    args.extend(lab.node("n1").node_args());
    args.extend(
        [
            "--insecure-registry",
            &host,
            "--min-free",
            "1Mi",
            "--authfile",
            &authfile,
            "-o",
            "json",
        ]
        .map(String::from),
    );
    for reference in [&app, &robot] {
        args.extend(["--image".into(), reference.clone()]);
    }
    let applied = run(home.path(), &args, &[]);
    assert_eq!(applied.code, 1, "{}{}", applied.stdout, applied.stderr);
    let report: Value = serde_json::from_str(&applied.stdout).unwrap();
    let n1 = &report["rollout"][0];
    assert_eq!(n1["pulled"], 1, "the password opened private/app: {n1}");
    let failed: Vec<&str> = n1["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(failed.len(), 1, "{n1}");
    assert!(failed[0].starts_with(&robot), "{n1}");
    assert!(
        failed[0].contains(&format!(
            "pinboard sent the identity token from entry \"{host}/private/robot\""
        )) && failed[0].contains("but CRI-O takes only a user name and password from CRI"),
        "{n1}"
    );
    assert!(!applied.stdout.contains(IDENTITY_TOKEN) && !applied.stderr.contains(IDENTITY_TOKEN));
}

#[test]
fn a_credential_granted_only_some_repositories_is_refused_for_another_and_never_shown() {
    let lab = token_lab("private-scope", vec![NodeSpec::new("n1", 32 * MI)]);
    let proxy = lab.proxy_host();
    let app = image(&lab, "private/app", 1221);
    let other = image(&lab, "private/billing", 1222);
    let home = tempfile::tempdir().unwrap();
    let authfile = home.path().join("auth.json");
    let encoded = base64::engine::general_purpose::STANDARD
        .encode(format!("{SCOPED_USER}:{SCOPED_PASSWORD}"));
    std::fs::write(
        &authfile,
        json!({"auths": {(proxy.as_str()): {"auth": encoded}}}).to_string(),
    )
    .unwrap();
    let plan = |image: &str| {
        let args = [
            "plan",
            "--cri",
            &format!("n1={}", lab.node("n1").endpoint()),
            "--insecure-registry",
            &proxy,
            "--authfile",
            &authfile.display().to_string(),
            "--min-free",
            "1Mi",
            "--image",
            image,
        ]
        .map(String::from);
        run(home.path(), &args, &[("PINBOARD_LOG", "debug")])
    };

    // The repository it is granted: planned.
    let granted = plan(&app);
    assert_eq!(granted.code, 0, "{}{}", granted.stdout, granted.stderr);

    // Another repository of the same registry: the token service leaves it out of the token, the registry
    // refuses, and plan says which registry, which image, which credential, and what to do.
    let refused = plan(&other);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    let errors: Vec<&str> = refused
        .stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    let said = format!(
        "error: registry {proxy} refused access to {other}: the credentials from entry \"{proxy}\" of {} \
         grant no pull access to repository private/billing (insufficient_scope); have that account \
         granted pull access to private/billing, or put credentials that have it in an entry for \
         {proxy}/private/billing",
        authfile.display()
    );
    assert_eq!(errors, [said.as_str()], "{}", refused.stderr);
    // The token service took the password and left the repository out of the token.
    let requests = lab.token_service().unwrap().requests();
    assert!(
        requests
            .iter()
            .any(|r| r.user.as_deref() == Some(SCOPED_USER) && r.status == 200),
        "{requests:?}"
    );
    let secrets = [SCOPED_PASSWORD.to_string(), encoded.clone()];
    for secret in secrets.iter().chain(&lab.token_service().unwrap().issued()) {
        for text in [
            &granted.stdout,
            &granted.stderr,
            &refused.stdout,
            &refused.stderr,
        ] {
            assert!(!text.contains(secret.as_str()), "a secret in:\n{text}");
        }
    }
}
