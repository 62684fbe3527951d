//! The manifests' YAML documents as objects to edit, each with the comment above it in its file: read from a
//! multi-document file of `deploy/agent/`, written back as one multi-document YAML with those comments
//! (kustomize drops every comment; `pinboard agent manifests` keeps the one that says what an object is for).

use serde_json::Value;

/// One object and the comment lines above it in its file.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// Whole lines, each starting with `#`, each ending with a newline.
    pub comment: String,
    pub object: Value,
}

/// The documents of `text`, a file of `deploy/agent/` (`file` names it if it does not parse: a bug of this
/// build, which the unit tests catch).
pub fn read(file: &str, text: &str) -> Vec<Document> {
    text.split("\n---\n")
        .filter_map(|chunk| {
            let body_at = chunk
                .lines()
                .take_while(|l| l.starts_with('#') || l.trim().is_empty())
                .map(|l| l.len() + 1)
                .sum::<usize>()
                .min(chunk.len());
            let (comment, body) = chunk.split_at(body_at);
            let object: Value = serde_saphyr::from_str(body)
                .unwrap_or_else(|e| panic!("{file} is not valid YAML: {e}"));
            let comment = comment
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| format!("{l}\n"))
                .collect();
            (!object.is_null()).then_some(Document { comment, object })
        })
        .collect()
}

/// `documents` as one multi-document YAML, for `kubectl apply -f -`.
pub fn write(documents: &[Document]) -> String {
    documents
        .iter()
        .map(|d| {
            let yaml = serde_saphyr::to_string(&d.object).expect("a JSON value serializes as YAML");
            format!("{}{yaml}", d.comment)
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_object_keeps_the_comment_above_it_and_reads_back_the_same() {
        let text = "# The first.\n# Two lines.\na: 1\n# inside: not kept\nb: [x, \"true\"]\n---\n\
                    c: {d: e}\n---\n# A trailing comment alone is no object.\n";
        let documents = read("test.yaml", text);
        assert_eq!(
            documents,
            vec![
                Document {
                    comment: "# The first.\n# Two lines.\n".into(),
                    object: json!({"a": 1, "b": ["x", "true"]}),
                },
                Document {
                    comment: String::new(),
                    object: json!({"c": {"d": "e"}}),
                },
            ]
        );
        let written = write(&documents);
        assert!(written.starts_with("# The first.\n# Two lines.\n"));
        assert!(!written.contains("inside"));
        let back: Vec<Value> = serde_saphyr::from_multiple(&written).unwrap();
        assert_eq!(
            back,
            documents
                .iter()
                .map(|d| d.object.clone())
                .collect::<Vec<_>>(),
            "a string that reads as a boolean stays a string"
        );
    }
}
