//! Label selectors, as Kubernetes evaluates them (`matchLabels`, `matchExpressions`) and as `kubectl -l`
//! writes them (`--selector`): `key=value`, `key!=value`, `key`, `!key`, `key in (a, b)`, `key notin (a)`.
//! Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// What is wrong with a selector, and how to write it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "selector {requirement:?}: {why}; write key=value, key!=value, key, !key, key in (a,b) or key \
         notin (a,b), separated by commas"
    )]
    Requirement { requirement: String, why: String },
    #[error("matchLabels {key}: {value:?} is not a label key and value")]
    MatchLabel { key: String, value: String },
    #[error(
        "matchExpressions {key}: operator {operator:?} is not In, NotIn, Exists or DoesNotExist"
    )]
    Operator { key: String, operator: String },
    #[error("matchExpressions: {0:?} is not a label key")]
    Key(String),
    #[error(
        "matchExpressions {key} {operator}: In and NotIn take values, Exists and DoesNotExist none"
    )]
    Values { key: String, operator: String },
}

/// A node selector a set carries: Kubernetes' own, with equality as its fields'.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(pub LabelSelector);

// Its fields are strings, lists and maps of strings: equality is total.
impl Eq for Selector {}

impl Selector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        selector_matches(Some(&self.0), labels)
    }
}

/// Whether `labels` satisfy `selector`, as Kubernetes evaluates it: an absent selector matches nothing, an
/// empty one everything; an unknown operator matches nothing.
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let match_labels = selector.match_labels.iter().flatten();
    let labels_ok = match_labels
        .into_iter()
        .all(|(key, value)| labels.get(key) == Some(value));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|req| {
        let value = labels.get(&req.key);
        let listed = || value.is_some_and(|v| req.values.iter().flatten().any(|x| x == v));
        match req.operator.as_str() {
            "In" => listed(),
            "NotIn" => !listed(),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

/// A selector written as `kubectl -l` takes it, checked: each requirement's key a valid label key, each
/// value a valid label value. Errors name the requirement and the fix.
pub fn parse_selector(text: &str) -> Result<LabelSelector, SelectorError> {
    let mut selector = LabelSelector::default();
    for requirement in split_requirements(text) {
        let requirement = requirement.trim();
        if requirement.is_empty() {
            continue;
        }
        let bad = |why: &str| SelectorError::Requirement {
            requirement: requirement.to_string(),
            why: why.to_string(),
        };
        let (key, operator, values) = if let Some(key) = requirement.strip_prefix('!') {
            (key.trim(), "DoesNotExist", Vec::new())
        } else if let Some((key, rest)) = set_operator(requirement) {
            let (operator, rest) = rest;
            let values = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| bad("the values of in and notin go in parentheses"))?;
            let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
            (key, operator, values)
        } else if let Some((key, value)) = requirement.split_once("!=") {
            (key.trim(), "NotIn", vec![value.trim().to_string()])
        } else if let Some((key, value)) = requirement
            .split_once("==")
            .or_else(|| requirement.split_once('='))
        {
            (key.trim(), "In", vec![value.trim().to_string()])
        } else {
            (requirement, "Exists", Vec::new())
        };
        if !valid_key(key) {
            return Err(bad(&format!("{key:?} is not a label key")));
        }
        if let Some(value) = values.iter().find(|v| !valid_value(v)) {
            return Err(bad(&format!("{value:?} is not a label value")));
        }
        let mut expression = LabelSelectorRequirement {
            key: key.to_string(),
            operator: operator.to_string(),
            values: (!values.is_empty()).then_some(values.clone()),
        };
        // `key=value` is a matchLabels entry, as kubectl reads it.
        if operator == "In" && values.len() == 1 && !requirement.contains(" in ") {
            selector
                .match_labels
                .get_or_insert_default()
                .insert(key.to_string(), values[0].clone());
            continue;
        }
        expression.values = expression.values.filter(|v| !v.is_empty());
        selector
            .match_expressions
            .get_or_insert_default()
            .push(expression);
    }
    Ok(selector)
}

/// `key in (…)` or `key notin (…)`: the key, and the operator with what follows it.
fn set_operator(requirement: &str) -> Option<(&str, (&'static str, &str))> {
    for (word, operator) in [(" notin ", "NotIn"), (" in ", "In")] {
        if let Some((key, rest)) = requirement.split_once(word) {
            return Some((key.trim(), (operator, rest)));
        }
    }
    None
}

/// The requirements of a selector: commas inside parentheses do not split.
fn split_requirements(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `[prefix/]name`: a DNS subdomain prefix of at most 253 characters, a name of 1..=63 alphanumerics,
/// `-`, `_` and `.`, beginning and ending alphanumeric.
pub fn valid_key(key: &str) -> bool {
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    prefix_ok && !name.is_empty() && valid_value(name)
}

/// Empty, or 1..=63 alphanumerics, `-`, `_` and `.`, beginning and ending alphanumeric.
pub fn valid_value(value: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.is_empty()
        || (value.len() <= 63
            && edge(value.chars().next())
            && edge(value.chars().last())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kubectl_selectors_read_as_kubernetes_evaluates_them() {
        let worker = labels(&[("node-role.kubernetes.io/worker", ""), ("zone", "a")]);
        let control = labels(&[("node-role.kubernetes.io/control-plane", ""), ("zone", "b")]);
        let matches = |text: &str, node: &BTreeMap<String, String>| {
            selector_matches(Some(&parse_selector(text).unwrap()), node)
        };
        assert!(matches("node-role.kubernetes.io/worker", &worker));
        assert!(!matches("node-role.kubernetes.io/worker", &control));
        assert!(matches("zone=a", &worker) && !matches("zone=a", &control));
        assert!(matches("zone==a", &worker));
        assert!(matches("zone!=a", &control) && !matches("zone!=a", &worker));
        assert!(matches("zone in (a, c)", &worker) && !matches("zone in (a,c)", &control));
        assert!(matches("zone notin (a)", &control));
        assert!(matches("!node-role.kubernetes.io/worker", &control));
        assert!(matches("zone=a,node-role.kubernetes.io/worker", &worker));
        assert!(matches("", &control), "empty selects every node");
    }

    #[test]
    fn a_bad_selector_names_the_requirement_and_how_to_write_one() {
        for (text, says) in [
            ("zone in a", "in parentheses"),
            ("Zone Name=a", "is not a label key"),
            ("zone=-a", "is not a label value"),
            ("my_corp.com/zone=a", "is not a label key"),
        ] {
            let err = parse_selector(text).unwrap_err().to_string();
            assert!(
                err.contains(says) && err.contains("key=value"),
                "{text}: {err}"
            );
        }
    }
}
