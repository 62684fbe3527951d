//! The agents' alert rules (deploy/agent/alerts/) through Prometheus' own promtool: the rules load, their
//! unit tests pass, every alert has a severity, a summary and a description and is tested both firing and
//! quiet, and the example configuration (with the rules it loads) is valid.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn alerts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/agent/alerts")
}

/// Runs `promtool ARGS` in the alerts' directory (the files name each other relative to it); its output.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(alerts_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool ({e}): run scripts/setup, which installs it (Debian's prometheus)")
        });
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{output}");
    output
}

fn yaml(file: &str) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(alerts_dir().join(file)).unwrap()).unwrap()
}

#[test]
fn the_rules_load_and_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", "rules.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_says_how_severe_and_what_to_do_and_is_tested_firing_and_quiet() {
    let rules = yaml("rules.yaml");
    let tests = yaml("rules.test.yaml");
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .collect();
    let alerts = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r["alert"].is_string());
    for rule in alerts {
        let alert = rule["alert"].as_str().unwrap();
        assert!(
            rule["labels"]["severity"].is_string(),
            "{alert} has a severity"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation].is_string(),
                "{alert} has a {annotation}"
            );
        }
        let expected: Vec<usize> = cases
            .iter()
            .filter(|c| c["alertname"] == alert)
            .map(|c| c["exp_alerts"].as_array().map_or(0, Vec::len))
            .collect();
        assert!(
            expected.iter().any(|n| *n > 0),
            "{alert}: no test where it fires"
        );
        assert!(
            expected.contains(&0),
            "{alert}: no test where it stays quiet"
        );
    }
}

#[test]
fn the_example_configuration_and_the_rules_it_loads_are_valid() {
    let checked = promtool(&["check", "config", "prometheus.yaml"]);
    assert!(checked.contains("SUCCESS: 1 rule files found"), "{checked}");
}
