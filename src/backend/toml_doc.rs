//! Editing TOML files so that everything pinboard does not change survives: comments, formatting, other
//! keys. Helpers over `toml_edit`, shared by the drop-ins pinboard writes.

use toml_edit::{Array, DocumentMut, Item, Table, TableLike, Value};

/// Why a file cannot be edited: it is not TOML, or holds something else where a table goes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TomlDocError {
    #[error("not valid TOML: {message}")]
    NotToml { message: String },
    #[error("{path} is not a table")]
    NotATable { path: String },
}

/// The document in `text` (None: an empty one).
pub(crate) fn parse(text: Option<&str>) -> Result<DocumentMut, TomlDocError> {
    text.unwrap_or("")
        .parse()
        .map_err(|e: toml_edit::TomlError| TomlDocError::NotToml {
            message: e.message().to_owned(),
        })
}

/// The table at `path`, created when missing: with `indent`, every level gets a header indented by it once
/// per level below the first (`[crio]` then `  [crio.image]`); without, only the last level does
/// (`[storage.options]`). Fails when something on the path is not a table.
pub(crate) fn table_at<'d>(
    doc: &'d mut DocumentMut,
    path: &[&str],
    indent: Option<&str>,
) -> Result<&'d mut dyn TableLike, TomlDocError> {
    let mut table: &mut dyn TableLike = doc.as_table_mut();
    for (depth, name) in path.iter().enumerate() {
        let item = table.entry(name).or_insert_with(|| {
            let mut new = Table::new();
            match indent {
                Some(indent) => new.decor_mut().set_prefix(indent.repeat(depth)),
                None => new.set_implicit(depth + 1 < path.len()),
            }
            Item::Table(new)
        });
        table = item
            .as_table_like_mut()
            .ok_or_else(|| TomlDocError::NotATable {
                path: path[..=depth].join("."),
            })?;
    }
    Ok(table)
}

/// Sets `key` to an array of `values` on one line, keeping the formatting of an existing key and value
/// (e.g. a trailing comment); a new key is indented by `indent`.
pub(crate) fn set_array<'v>(
    table: &mut dyn TableLike,
    key: &str,
    values: impl IntoIterator<Item = &'v str>,
    indent: &str,
) {
    let mut array: Array = values.into_iter().collect();
    array.fmt();
    set_value(table, key, Value::Array(array), indent);
}

/// Sets `key` to `value`, keeping the decor of an existing value (e.g. a trailing comment); a new key is
/// indented by `indent`.
pub(crate) fn set_value(table: &mut dyn TableLike, key: &str, value: Value, indent: &str) {
    match table.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            let decor = old.decor().clone();
            *old = value;
            *old.decor_mut() = decor;
        }
        None => {
            table.insert(key, Item::Value(value));
            if let Some(mut k) = table.key_mut(key) {
                k.leaf_decor_mut().set_prefix(indent);
            }
        }
    }
}

/// Whether `item` sets anything (a table counts only for the keys under it).
pub(crate) fn has_values(item: &Item) -> bool {
    match item.as_table_like() {
        Some(table) => table.iter().any(|(_, i)| has_values(i)),
        None => !item.is_none(),
    }
}

/// The text of a prefix or suffix decoration (empty when there is none).
pub(crate) fn decor_text(raw: Option<&toml_edit::RawString>) -> &str {
    raw.and_then(toml_edit::RawString::as_str).unwrap_or("")
}
