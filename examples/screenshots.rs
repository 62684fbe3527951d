//! Screenshots of every screen: draws each of [`pinboard::ui::demo::screens`] — the same states the
//! snapshot tests compare — at 120×40 in the dark theme, and writes the buffer as SVG.
//!
//! ```text
//! cargo run --example screenshots -- [DIR]
//! ```
//! Writes `DIR/<screen>.svg` (DIR defaults to `screenshots`) and prints each path; `scripts/screenshots`
//! turns them into PNGs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use pinboard::ui::demo::screens;
use pinboard::ui::render::render_to_buffer;
use pinboard::ui::svg::buffer_to_svg;
use pinboard::ui::theme::Theme;

const WIDTH: u16 = 120;
const HEIGHT: u16 = 40;

fn main() -> Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "screenshots".into()),
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let theme = Theme::named("dark").map_err(anyhow::Error::msg)?;
    for (name, state) in screens(Instant::now(), &theme) {
        let svg = buffer_to_svg(&render_to_buffer(&state, WIDTH, HEIGHT), &theme);
        let path = dir.join(format!("{name}.svg"));
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}
