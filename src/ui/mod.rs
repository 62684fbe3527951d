//! How pinboard looks. Today: each status as glyph + word + theme color, shared by the headless commands'
//! tables and the terminal UI's screens, so a status reads the same everywhere and never by color alone.

pub mod status;
pub mod theme;
