//! A rendered buffer as SVG: monospace text with each cell's colors, for screenshots (rsvg-convert turns it
//! into PNG). Runs of cells with the same style become one `<text>` stretched to their exact width, so the
//! grid holds whatever the font's advance is.

use std::fmt::Write;

use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

use super::theme::Theme;

const CELL_WIDTH: f64 = 8.4;
const CELL_HEIGHT: f64 = 18.0;
const FONT_SIZE: f64 = 14.0;

/// The terminal's own colors, which `Color::Reset` stands for.
fn defaults(theme: &Theme) -> (&'static str, &'static str) {
    if theme.name == "light" {
        ("#1f2328", "#ffffff")
    } else {
        ("#d0d0d0", "#1c1c1c")
    }
}

pub fn buffer_to_svg(buffer: &Buffer, theme: &Theme) -> String {
    let (default_fg, default_bg) = defaults(theme);
    let area = buffer.area;
    let (width, height) = (
        f64::from(area.width) * CELL_WIDTH,
        f64::from(area.height) * CELL_HEIGHT,
    );
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"DejaVu Sans Mono, monospace\" \
         font-size=\"{FONT_SIZE}\" xml:space=\"preserve\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"{default_bg}\"/>\n"
    );
    for y in 0..area.height {
        let mut x = 0;
        while x < area.width {
            let first = &buffer[(area.x + x, area.y + y)];
            let style = (first.fg, first.bg, first.modifier);
            let mut text = String::new();
            let start = x;
            while x < area.width {
                let cell = &buffer[(area.x + x, area.y + y)];
                if (cell.fg, cell.bg, cell.modifier) != style {
                    break;
                }
                text.push_str(cell.symbol());
                x += 1;
            }
            let (mut fg, mut bg) = (
                color(style.0).unwrap_or(default_fg.into()),
                color(style.1).unwrap_or(default_bg.into()),
            );
            if style.2.contains(Modifier::REVERSED) {
                std::mem::swap(&mut fg, &mut bg);
            }
            let (left, top) = (f64::from(start) * CELL_WIDTH, f64::from(y) * CELL_HEIGHT);
            let run = f64::from(x - start) * CELL_WIDTH;
            if bg != default_bg {
                let _ = writeln!(
                    svg,
                    "<rect x=\"{left}\" y=\"{top}\" width=\"{run}\" height=\"{CELL_HEIGHT}\" fill=\"{bg}\"/>"
                );
            }
            if text.trim().is_empty() {
                continue;
            }
            let weight = if style.2.contains(Modifier::BOLD) {
                " font-weight=\"bold\""
            } else {
                ""
            };
            let opacity = if style.2.contains(Modifier::DIM) {
                " fill-opacity=\"0.75\""
            } else {
                ""
            };
            let _ = writeln!(
                svg,
                "<text x=\"{left}\" y=\"{}\" textLength=\"{run}\" lengthAdjust=\"spacingAndGlyphs\" \
                 fill=\"{fg}\"{weight}{opacity}>{}</text>",
                top + CELL_HEIGHT * 0.75,
                escape(&text)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `None` for the terminal's default.
fn color(color: Color) -> Option<String> {
    let named = |hex: &str| Some(hex.to_string());
    match color {
        Color::Reset => None,
        Color::Black => named("#000000"),
        Color::Red => named("#cd3131"),
        Color::Green => named("#0dbc79"),
        Color::Yellow => named("#e5e510"),
        Color::Blue => named("#2472c8"),
        Color::Magenta => named("#bc3fbc"),
        Color::Cyan => named("#11a8cd"),
        Color::Gray => named("#a0a0a0"),
        Color::DarkGray => named("#666666"),
        Color::LightRed => named("#f14c4c"),
        Color::LightGreen => named("#23d18b"),
        Color::LightYellow => named("#f5f543"),
        Color::LightBlue => named("#3b8eea"),
        Color::LightMagenta => named("#d670d6"),
        Color::LightCyan => named("#29b8db"),
        Color::White => named("#e5e5e5"),
        Color::Rgb(r, g, b) => Some(format!("#{r:02x}{g:02x}{b:02x}")),
        Color::Indexed(i) => Some(indexed(i)),
    }
}

/// The xterm 256-color palette above the 16 named colors (which themes name directly).
fn indexed(i: u8) -> String {
    match i {
        16..=231 => {
            let level = |v: u8| if v == 0 { 0 } else { 55 + 40 * v };
            let i = i - 16;
            format!(
                "#{:02x}{:02x}{:02x}",
                level(i / 36),
                level(i / 6 % 6),
                level(i % 6)
            )
        }
        232..=255 => {
            let v = 8 + 10 * (i - 232);
            format!("#{v:02x}{v:02x}{v:02x}")
        }
        _ => "#808080".into(),
    }
}
