//! How pinboard looks: each status as glyph + word + theme color, shared by the headless commands' tables
//! and the terminal UI, so a status reads the same everywhere and never by color alone; and the terminal
//! UI itself.
//!
//! The TUI is Elm-shaped: [`state::State`] holds everything the screens show, [`update::update`] folds a
//! [`msg::Msg`] into it and returns [`msg::Cmd`]s (pure: no I/O, no clock), [`render::render`] draws it,
//! and [`run::run`] connects them to the terminal and a [`run::UiBackend`].

pub mod demo;
pub mod keymap;
mod layout;
pub mod live;
pub mod msg;
mod options;
pub mod render;
pub mod run;
mod screens;
pub mod state;
pub mod status;
pub mod svg;
pub mod theme;
pub mod update;
mod widgets;

pub use options::TuiArgs;

#[cfg(test)]
mod tests;
