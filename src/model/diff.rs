//! A line diff, for showing what pinboard will write to a node's config against what is there.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiffKind {
    Same,
    Added,
    Removed,
}

/// `old` to `new` (`None`: no file), line by line, by longest common subsequence: config files are small.
pub fn lines(old: Option<&str>, new: Option<&str>) -> Vec<(DiffKind, String)> {
    let a: Vec<&str> = old.map_or_else(Vec::new, |t| t.lines().collect());
    let b: Vec<&str> = new.map_or_else(Vec::new, |t| t.lines().collect());
    // lcs[i][j]: length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push((DiffKind::Same, a[i].to_string()));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // Removals first, as diff(1) shows a changed line.
            out.push((DiffKind::Removed, a[i].to_string()));
            i += 1;
        } else {
            out.push((DiffKind::Added, b[j].to_string()));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::DiffKind::*;
    use super::*;

    #[test]
    fn a_changed_line_is_removed_then_added() {
        let got = lines(Some("a\nb\nc\n"), Some("a\nx\nc\nd\n"));
        let want = [
            (Same, "a"),
            (Removed, "b"),
            (Added, "x"),
            (Same, "c"),
            (Added, "d"),
        ];
        assert_eq!(got, want.map(|(k, t)| (k, t.to_string())));
        assert_eq!(lines(None, Some("a")), [(Added, "a".to_string())]);
        assert_eq!(lines(Some("a"), None), [(Removed, "a".to_string())]);
    }
}
