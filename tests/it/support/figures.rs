//! A figure pinboard reports held against what the lab measured (most often the proxy's bytes).

/// Asserts that `reported` is within `within` (a fraction) of `measured`, and says both on stderr for
/// `what`.
pub fn assert_within(what: &str, reported: u64, measured: u64, within: f64) {
    let apart = (reported as f64 - measured as f64).abs() / measured as f64;
    eprintln!(
        "{what}: {reported} reported, {measured} measured ({:.2} % apart)",
        apart * 100.0
    );
    assert!(
        apart <= within,
        "{what}: {reported} reported, {measured} measured: {:.2} % apart, more than {:.0} %",
        apart * 100.0,
        within * 100.0
    );
}
