//! Glyph and word for every status pinboard shows.

use crate::model::plan::Verdict;

/// `✓ fits`, `! tight`, `✗ no-space`, `? unknown`.
pub fn verdict_label(verdict: Verdict) -> String {
    let glyph = match verdict {
        Verdict::Fits => "✓",
        Verdict::Tight => "!",
        Verdict::NoSpace => "✗",
        Verdict::Unknown => "?",
    };
    format!("{glyph} {}", verdict.as_str())
}
