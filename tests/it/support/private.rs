//! The lab's token-protected registry and an auth file for it, shared by the tests of private images
//! (tests/it/private_registry.rs, tests/it/fanout.rs, tests/it/agents_fanout.rs).

use std::path::Path;

use base64::Engine as _;
use serde_json::json;

use super::{Lab, LabConfig, NodeSpec, RegistrySetup, Run, TokenConfig, TokenUser};

pub const USER: &str = "alice";
pub const PASSWORD: &str = "alice-s3cret-pass";
pub const IDENTITY_TOKEN: &str = "robot-identity-token-7f3a";
/// A user the token service grants only `private/app`.
pub const SCOPED_USER: &str = "carol";
pub const SCOPED_PASSWORD: &str = "carol-only-app-pass";

/// The lab's registry behind the token service: `alice` pulls `private/*` with a password, `robot` only
/// `private/robot`, with an identity token, `carol` only `private/app`, with a password; `public/*` is
/// open.
pub fn token_lab(name: &str, nodes: Vec<NodeSpec>) -> Lab {
    Lab::start(
        name,
        LabConfig {
            nodes,
            registry: token_registry(),
            ..LabConfig::default()
        },
    )
    .expect("lab starts")
}

/// The registry of [`token_lab`].
pub fn token_registry() -> RegistrySetup {
    let mut robot = TokenUser::new("robot", "robot-unused-password", &["private/robot"]);
    robot.identity_token = Some(IDENTITY_TOKEN.into());
    RegistrySetup {
        tokens: Some(TokenConfig {
            users: vec![
                TokenUser::new(USER, PASSWORD, &["private/*"]),
                robot,
                TokenUser::new(SCOPED_USER, SCOPED_PASSWORD, &["private/app"]),
            ],
            public: vec!["public/*".into()],
        }),
        ..RegistrySetup::default()
    }
}

/// `USER:PASSWORD` as an auth file's `auth` field holds it.
pub fn encoded_login() -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
}

/// An auth file for `host`: the password for the registry, the identity token for `private/robot`.
pub fn auth_file(dir: &Path, host: &str) -> String {
    let path = dir.join("auth.json");
    std::fs::write(
        &path,
        json!({"auths": {
            host: {"auth": encoded_login()},
            (format!("{host}/private/robot")): {"identitytoken": IDENTITY_TOKEN},
        }})
        .to_string(),
    )
    .unwrap();
    path.display().to_string()
}

/// Every secret of `lab`'s token registry a test must never find in pinboard's output: the passwords, the
/// base64 of alice's, the identity token, and each token the service issued (and its signature alone,
/// should a log cut a token).
pub fn secrets(lab: &Lab) -> Vec<String> {
    let mut secrets = vec![
        PASSWORD.to_string(),
        encoded_login(),
        IDENTITY_TOKEN.to_string(),
        SCOPED_PASSWORD.to_string(),
    ];
    for token in lab.token_service().expect("a token lab").issued() {
        secrets.push(token.rsplit('.').next().unwrap().to_string());
        secrets.push(token);
    }
    secrets
}

/// Asserts that no output of `runs` (named) holds any of [`secrets`].
pub fn assert_no_secret(lab: &Lab, runs: &[(&str, &Run)]) {
    let secrets = secrets(lab);
    for (name, run) in runs {
        for secret in &secrets {
            for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
                assert!(
                    !text.contains(secret.as_str()),
                    "{name} {stream} holds a secret:\n{text}"
                );
            }
        }
    }
}
