//! What the headless commands print: JSON, YAML, or a human table (columns aligned by characters).

use std::collections::HashMap;
use std::io::Write as _;

use serde::Serialize;

use crate::error::Failure;
pub use crate::model::reference::short_reference;
use crate::options::Output;

/// `value` as `output` asks: pretty JSON, YAML, or the table `table` draws.
pub fn render<T: Serialize>(
    value: &T,
    output: Output,
    table: impl FnOnce() -> String,
) -> Result<String, Failure> {
    match output {
        Output::Json => serde_json::to_string_pretty(value)
            .map(|json| json + "\n")
            .map_err(|e| Failure::bad_input(format!("cannot write JSON: {e}"))),
        Output::Yaml => serde_saphyr::to_string(value)
            .map_err(|e| Failure::bad_input(format!("cannot write YAML: {e}"))),
        Output::Table => Ok(table()),
    }
}

/// `value` as pretty JSON on stdout, written as it is serialized. A closed pipe (`| head`) ends it quietly,
/// as printing any other output does.
pub fn write_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut stdout, value)
        .map_err(std::io::Error::from)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::bad_input(format!("cannot write JSON: {e}")))
        }
        _ => Ok(()),
    }
}

/// `failure`, once `text` is on stdout: a command that fails still prints what it found. A closed pipe is
/// not worth more than the exit code that follows.
pub fn printed_then(text: &str, failure: Failure) -> Failure {
    let mut stdout = std::io::stdout();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    failure
}

/// Left-aligned columns separated by two spaces; widths by characters, not bytes. `paint(row, column, text)`
/// may decorate a body cell (e.g. color it) without changing its width.
pub fn table(
    headers: &[String],
    rows: &[Vec<String>],
    paint: &dyn Fn(usize, usize, &str) -> String,
) -> String {
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([headers[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..headers.len()).map(width).collect();
    let line = |cells: &[String], painted: &dyn Fn(usize, &str) -> String| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(column, (cell, w))| {
                painted(column, cell) + &" ".repeat(w - cell.chars().count())
            })
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    std::iter::once(line(headers, &|_, text| text.to_string()))
        .chain(
            rows.iter()
                .enumerate()
                .map(|(row, cells)| line(cells, &|column, text| paint(row, column, text))),
        )
        .collect()
}

/// The image × node matrix: a row per image (first-seen order over every node's `images`), the columns
/// `lead` gives for the image (from the first node that has it), then one per node: `cell` of the node's
/// entry for the image, or `-` when the node is not asked for it (cluster nodes of different pools).
pub fn image_matrix<I>(
    lead: &[&str],
    nodes: &[(&str, &[I])],
    reference: impl Fn(&I) -> &str,
    lead_cells: impl Fn(&I) -> Vec<String>,
    cell: impl Fn(&I) -> String,
) -> String {
    let mut rows: Vec<(&str, Vec<String>)> = Vec::new();
    let mut row_of: HashMap<&str, usize> = HashMap::new();
    for (column, (_, images)) in nodes.iter().enumerate() {
        for image in *images {
            let r = reference(image);
            let row = *row_of.entry(r).or_insert_with(|| {
                let mut cells = vec![short_reference(r)];
                cells.extend(lead_cells(image));
                cells.extend(nodes.iter().map(|_| "-".to_string()));
                rows.push((r, cells));
                rows.len() - 1
            });
            rows[row].1[1 + lead.len() + column] = cell(image);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let mut headers = vec!["IMAGE".to_string()];
    headers.extend(lead.iter().map(|h| h.to_string()));
    headers.extend(nodes.iter().map(|(name, _)| name.to_string()));
    let cells: Vec<Vec<String>> = rows.into_iter().map(|(_, cells)| cells).collect();
    table(&headers, &cells, &|_, _, text| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_by_characters() {
        let rows = [
            vec!["✓ fits".into(), "x".into()],
            vec!["?".into(), "yy".into()],
        ];
        let t = table(&["A".into(), "B".into()], &rows, &|_, _, text| {
            text.to_string()
        });
        assert_eq!(t, "A       B\n✓ fits  x\n?       yy\n");
        let painted = table(&["A".into(), "B".into()], &rows, &|row, column, text| {
            if (row, column) == (1, 0) {
                format!("<{text}>")
            } else {
                text.to_string()
            }
        });
        assert_eq!(
            painted, "A       B\n✓ fits  x\n<?>       yy\n",
            "decoration does not shift columns"
        );
    }
}
