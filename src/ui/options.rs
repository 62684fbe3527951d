//! The terminal UI's options: the argument list every command takes, plus how the UI itself behaves.

use clap::Args;

use crate::options::CommonArgs;

#[derive(Args, Debug, Default)]
pub struct TuiArgs {
    /// Sets to start with (more can be composed or imported in the UI), the nodes, the registry, limits.
    #[command(flatten)]
    pub common: CommonArgs,
    /// A pull without byte progress for this long is shown as stalled.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        help_heading = "Terminal UI"
    )]
    pub stall_after: u64,
    /// Change nothing: no pulls, no pins, no files written.
    #[arg(long, help_heading = "Terminal UI")]
    pub readonly: bool,
    /// Color theme: dark, light or monochrome (monochrome whenever NO_COLOR is set).
    #[arg(long, value_name = "NAME", help_heading = "Terminal UI")]
    pub theme: Option<String>,
}
