//! A rendered buffer as SVG, for screenshots (rsvg-convert turns it into PNG). Every cell sits at its exact
//! place on the grid: plain text is placed word by word (rsvg ignores `textLength`, so a long run would
//! drift by the font's rounding), any other glyph gets its own `<text>` at its cell, and box-drawing lines,
//! blocks and shades are drawn as rectangles on whole pixels, so borders join and bars fill their cells
//! whatever the font.

use std::fmt::Write;

use ratatui::buffer::{Buffer, Cell};
use ratatui::style::{Color, Modifier};

use super::theme::Theme;

const FONT_SIZE: f64 = 14.0;
/// DejaVu Sans Mono's advance (1233/2048 em), so its glyphs fill their cells exactly.
const CELL_WIDTH: f64 = FONT_SIZE * 1233.0 / 2048.0;
const CELL_HEIGHT: f64 = 18.0;
/// From the cell's top: DejaVu Sans Mono's ascent and descent (0.93 + 0.24 em) centred in the cell.
const BASELINE: f64 = 14.0;
const FONTS: &str = "'DejaVu Sans Mono', 'Liberation Mono', Menlo, Consolas, monospace";

/// The terminal's own colors, which `Color::Reset` stands for.
fn defaults(theme: &Theme) -> (&'static str, &'static str) {
    if theme.name == "light" {
        ("#1f2328", "#ffffff")
    } else {
        ("#d0d0d0", "#1c1c1c")
    }
}

/// A cell's colors (reverse applied) and its text attributes as SVG.
#[derive(Clone, PartialEq)]
struct Look {
    fg: String,
    bg: String,
    /// ` font-weight="bold"` and the like, each with its leading space.
    attributes: String,
}

impl Look {
    fn of(cell: &Cell, (default_fg, default_bg): (&str, &str)) -> Look {
        let (mut fg, mut bg) = (
            color(cell.fg).unwrap_or(default_fg.into()),
            color(cell.bg).unwrap_or(default_bg.into()),
        );
        if cell.modifier.contains(Modifier::REVERSED) {
            std::mem::swap(&mut fg, &mut bg);
        }
        let mut attributes = String::new();
        for (modifier, attribute) in [
            (Modifier::BOLD, " font-weight=\"bold\""),
            (Modifier::DIM, " fill-opacity=\"0.75\""),
            (Modifier::UNDERLINED, " text-decoration=\"underline\""),
        ] {
            if cell.modifier.contains(modifier) {
                attributes.push_str(attribute);
            }
        }
        Look { fg, bg, attributes }
    }
}

/// The x of a cell's left edge, on a whole pixel so that shapes of neighbouring cells meet without a seam.
fn edge(column: u16) -> f64 {
    (f64::from(column) * CELL_WIDTH).round()
}

pub fn buffer_to_svg(buffer: &Buffer, theme: &Theme) -> String {
    let defaults = defaults(theme);
    let area = buffer.area;
    let (width, height) = (edge(area.width), f64::from(area.height) * CELL_HEIGHT);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"{FONTS}\" font-size=\"{FONT_SIZE}\" \
         xml:space=\"preserve\">\n<rect width=\"100%\" height=\"100%\" fill=\"{}\"/>\n",
        defaults.1
    );
    for y in 0..area.height {
        let top = f64::from(y) * CELL_HEIGHT;
        let cells: Vec<(&str, Look)> = (0..area.width)
            .map(|x| {
                let cell = &buffer[(area.x + x, area.y + y)];
                (cell.symbol(), Look::of(cell, defaults))
            })
            .collect();
        backgrounds(&mut svg, &cells, top, defaults.1);
        // The ASCII word being gathered: its first column and text.
        let mut word: Option<(u16, String)> = None;
        for (x, (symbol, look)) in (0..).zip(&cells) {
            if let Some((start, text)) = &mut word {
                if symbol.is_ascii() && *symbol != " " && cells[usize::from(*start)].1 == *look {
                    text.push_str(symbol);
                    continue;
                }
                put_text(&mut svg, *start, text, top, &cells[usize::from(*start)].1);
                word = None;
            }
            if let Some(shape) = Shape::of(symbol) {
                shape.draw(&mut svg, x, top, look);
            } else if symbol.is_ascii() {
                if *symbol != " " {
                    word = Some((x, symbol.to_string()));
                }
            } else if !symbol.trim().is_empty() {
                put_text(&mut svg, x, symbol, top, look);
            }
        }
        if let Some((start, text)) = word {
            put_text(&mut svg, start, &text, top, &cells[usize::from(start)].1);
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// One rectangle per run of cells sharing a background other than the terminal's.
fn backgrounds(svg: &mut String, cells: &[(&str, Look)], top: f64, default_bg: &str) {
    let mut start = 0;
    while start < cells.len() {
        let bg = &cells[start].1.bg;
        let end = cells[start..]
            .iter()
            .position(|(_, look)| look.bg != *bg)
            .map_or(cells.len(), |n| start + n);
        if bg != default_bg {
            let (left, right) = (edge(start as u16), edge(end as u16));
            let _ = writeln!(
                svg,
                "<rect x=\"{left}\" y=\"{top}\" width=\"{}\" height=\"{CELL_HEIGHT}\" fill=\"{bg}\"/>",
                right - left
            );
        }
        start = end;
    }
}

/// `text` from the left edge of `column` on.
fn put_text(svg: &mut String, column: u16, text: &str, top: f64, look: &Look) {
    let _ = writeln!(
        svg,
        "<text x=\"{:.2}\" y=\"{}\" fill=\"{}\"{}>{}</text>",
        f64::from(column) * CELL_WIDTH,
        top + BASELINE,
        look.fg,
        look.attributes,
        escape(text)
    );
}

/// A glyph drawn as rectangles rather than taken from the font.
enum Shape {
    /// Box-drawing lines from the centre to the edges: up, right, down, left; 0 none, 1 light, 2 heavy.
    Lines([u8; 4]),
    /// A block element: the part of the cell it fills, as fractions (left, top, right, bottom).
    Block([f64; 4]),
    /// `░ ▒ ▓`: the whole cell in the foreground color at this opacity (denser than the glyphs' dots, which
    /// a flat fill would otherwise make too faint to see against the background).
    Shade(f64),
}

impl Shape {
    fn of(symbol: &str) -> Option<Shape> {
        let mut chars = symbol.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            return None;
        };
        let lines = |arms| Some(Shape::Lines(arms));
        let block = |part| Some(Shape::Block(part));
        let eighths = |n: u8| f64::from(n) / 8.0;
        match c {
            '─' => lines([0, 1, 0, 1]),
            '━' => lines([0, 2, 0, 2]),
            '│' => lines([1, 0, 1, 0]),
            '┃' => lines([2, 0, 2, 0]),
            '┌' => lines([0, 1, 1, 0]),
            '┏' => lines([0, 2, 2, 0]),
            '┐' => lines([0, 0, 1, 1]),
            '┓' => lines([0, 0, 2, 2]),
            '└' => lines([1, 1, 0, 0]),
            '┗' => lines([2, 2, 0, 0]),
            '┘' => lines([1, 0, 0, 1]),
            '┛' => lines([2, 0, 0, 2]),
            '├' => lines([1, 1, 1, 0]),
            '┣' => lines([2, 2, 2, 0]),
            '┤' => lines([1, 0, 1, 1]),
            '┫' => lines([2, 0, 2, 2]),
            '┬' => lines([0, 1, 1, 1]),
            '┳' => lines([0, 2, 2, 2]),
            '┴' => lines([1, 1, 0, 1]),
            '┻' => lines([2, 2, 0, 2]),
            '┼' => lines([1, 1, 1, 1]),
            '╋' => lines([2, 2, 2, 2]),
            '╴' => lines([0, 0, 0, 1]),
            '╵' => lines([1, 0, 0, 0]),
            '╶' => lines([0, 1, 0, 0]),
            '╷' => lines([0, 0, 1, 0]),
            '█' => block([0.0, 0.0, 1.0, 1.0]),
            '▀' => block([0.0, 0.0, 1.0, 0.5]),
            '▐' => block([0.5, 0.0, 1.0, 1.0]),
            // ▁ to ▇: the lower n eighths.
            '▁'..='▇' => block([0.0, 1.0 - eighths(c as u8 - 0x80), 1.0, 1.0]),
            // ▉ to ▏: the left 7 to 1 eighths.
            '▉'..='▏' => block([0.0, 0.0, eighths(0x90 - c as u8), 1.0]),
            '░' => Some(Shape::Shade(0.45)),
            '▒' => Some(Shape::Shade(0.65)),
            '▓' => Some(Shape::Shade(0.85)),
            _ => None,
        }
    }

    fn draw(&self, svg: &mut String, column: u16, top: f64, look: &Look) {
        let (left, right) = (edge(column), edge(column + 1));
        let bottom = top + CELL_HEIGHT;
        // Rectangles as subpaths of one path: where they overlap, the color is laid once.
        let mut path = String::new();
        let mut rect = |x0: f64, y0: f64, x1: f64, y1: f64| {
            let _ = write!(path, "M{x0} {y0}H{x1}V{y1}H{x0}Z");
        };
        let mut opacity = if look.attributes.contains("fill-opacity") {
            0.75
        } else {
            1.0
        };
        match *self {
            Shape::Lines([up, right_arm, down, left_arm]) => {
                // The centre pixel; a light line is 1 pixel thick, a heavy one 3, both on whole pixels.
                let (cx, cy) = (
                    ((left + right) / 2.0).floor(),
                    top + (CELL_HEIGHT / 2.0).floor(),
                );
                let half = |weight: u8| if weight == 2 { 1.0 } else { 0.0 };
                for (weight, x0, x1) in [(left_arm, left, cx + 1.0), (right_arm, cx, right)] {
                    if weight > 0 {
                        rect(x0, cy - half(weight), x1, cy + 1.0 + half(weight));
                    }
                }
                for (weight, y0, y1) in [(up, top, cy + 1.0), (down, cy, bottom)] {
                    if weight > 0 {
                        rect(cx - half(weight), y0, cx + 1.0 + half(weight), y1);
                    }
                }
            }
            Shape::Block([x0, y0, x1, y1]) => {
                let x = |f: f64| (left + f * (right - left)).round();
                let y = |f: f64| (top + f * CELL_HEIGHT).round();
                rect(x(x0), y(y0), x(x1), y(y1));
            }
            Shape::Shade(shade) => {
                rect(left, top, right, bottom);
                opacity *= shade;
            }
        }
        let _ = writeln!(
            svg,
            "<path d=\"{path}\" fill=\"{}\" fill-opacity=\"{opacity}\"/>",
            look.fg
        );
    }
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
        // xterm's bright black: darker ones leave dim text hard to read on the dark background.
        Color::DarkGray => named("#7f7f7f"),
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
