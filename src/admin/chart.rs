//! The status page's charts (B91): inline SVG, no script and no external
//! asset, so that the page stays one self-contained document that
//! refreshes itself.
//!
//! The plot stretches to its card's width (`preserveAspectRatio="none"`,
//! strokes that do not scale with it); every word on a chart (its scale,
//! its time axis, its legend) is HTML beside the SVG, so text keeps its size
//! and stays legible at a phone's width as at 1920 px.

use std::fmt::Write;

use crate::admin::html::escape;

/// The plot's own coordinates: one unit per second of a 10-minute window
/// across, 100 units up.
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 100.0;

/// One line of a chart.
pub struct Line {
    /// The CSS class that colours it.
    pub class: &'static str,
    /// Its name in the legend.
    pub name: &'static str,
    /// Its latest value as the legend shows it.
    pub now: String,
    /// `(seconds ago, value)`, oldest first; `None` breaks the line.
    pub points: Vec<Option<(f64, f64)>>,
}

/// One chart, as a card of the page.
pub struct Chart<'a> {
    /// The SVG element's id.
    pub id: &'static str,
    pub title: &'a str,
    /// The value at the top of the plot.
    pub top: f64,
    /// How the top is labelled ("2,500 lot", "40/s").
    pub top_label: String,
    /// Whether the top is a limit (the lot), drawn as a dashed line.
    pub top_is_limit: bool,
    /// Whether the first line's area is filled.
    pub area: bool,
    pub lines: Vec<Line>,
    /// Further figures for the legend, `(name, value)`.
    pub notes: Vec<(&'static str, String)>,
    /// Said over the plot when no line has a point.
    pub empty: &'a str,
}

impl Chart<'_> {
    /// The chart's card: title, plot, time axis and legend.
    pub fn card(&self) -> String {
        let mut h = String::new();
        let described =
            self.lines.iter().map(|l| format!("{} {}", l.name, l.now)).collect::<Vec<_>>().join(", ");
        let _ = write!(
            h,
            "<section class=\"card chart\"><h2>{}</h2><div class=\"plot\"><span class=\"top\">{}</span>\
             <svg id=\"{}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" preserveAspectRatio=\"none\" role=\"img\" \
             aria-label=\"{}, last 10 minutes: {}\">",
            escape(self.title),
            escape(&self.top_label),
            self.id,
            escape(self.title),
            escape(&described)
        );
        let limit = if self.top_is_limit { " limit" } else { "" };
        let _ = write!(
            h,
            "<path class=\"grid{limit}\" d=\"M0 0.5H{WIDTH}\"/><path class=\"grid\" d=\"M0 50H{WIDTH}\"/>\
             <path class=\"grid base\" d=\"M0 {HEIGHT}H{WIDTH}\"/>"
        );
        let mut drawn = false;
        for (i, line) in self.lines.iter().enumerate() {
            let d = path(&line.points, self.top);
            if d.is_empty() {
                continue;
            }
            drawn = true;
            if i == 0 && self.area {
                let _ =
                    write!(h, "<path class=\"area {}\" d=\"{}\"/>", line.class, area(&line.points, self.top));
            }
            let _ = write!(h, "<path class=\"line {}\" d=\"{d}\"/>", line.class);
        }
        h.push_str("</svg>");
        if !drawn {
            let _ = write!(h, "<span class=\"empty\">{}</span>", escape(self.empty));
        }
        h.push_str(
            "</div><div class=\"axis\"><span>10 min ago</span><span>5 min</span><span>now</span></div><ul class=\"legend\">",
        );
        for line in &self.lines {
            let _ = write!(
                h,
                "<li><i class=\"{}\"></i>{} <b>{}</b></li>",
                line.class,
                escape(line.name),
                escape(&line.now)
            );
        }
        for (name, value) in &self.notes {
            let _ = write!(h, "<li class=\"note\">{} <b>{}</b></li>", escape(name), escape(value));
        }
        h.push_str("</ul></section>");
        h
    }
}

/// Where `(seconds ago, value)` falls in the plot.
fn xy((ago, value): (f64, f64), top: f64) -> (f64, f64) {
    let x = (WIDTH - ago).clamp(0.0, WIDTH);
    let y = if top > 0.0 { HEIGHT - (value / top).clamp(0.0, 1.0) * HEIGHT } else { HEIGHT };
    (x, y)
}

/// An SVG path through the points, one `M` per unbroken run; a run of one
/// point is a short dash, so that it shows.
fn path(points: &[Option<(f64, f64)>], top: f64) -> String {
    let mut d = String::new();
    for run in points.split(Option::is_none) {
        let mut run = run.iter().flatten().map(|&p| xy(p, top));
        let Some((x, y)) = run.next() else { continue };
        let _ = write!(d, "M{x:.1} {y:.1}");
        let mut alone = true;
        for (x, y) in run {
            let _ = write!(d, "L{x:.1} {y:.1}");
            alone = false;
        }
        if alone {
            let _ = write!(d, "h1");
        }
    }
    d
}

/// The area under the points down to zero, one closed shape per run.
fn area(points: &[Option<(f64, f64)>], top: f64) -> String {
    let mut d = String::new();
    for run in points.split(Option::is_none) {
        let run: Vec<(f64, f64)> = run.iter().flatten().map(|&p| xy(p, top)).collect();
        let (Some(first), Some(last)) = (run.first(), run.last()) else { continue };
        let _ = write!(d, "M{:.1} {HEIGHT}", first.0);
        for (x, y) in &run {
            let _ = write!(d, "L{x:.1} {y:.1}");
        }
        let _ = write!(d, "L{:.1} {HEIGHT}Z", last.0);
    }
    d
}

/// The smallest of 1, 2, 2.5 and 5 times a power of ten that is at least
/// `value` (and at least `floor`): a scale's top that reads well.
pub fn nice_ceiling(value: f64, floor: f64) -> f64 {
    let value = value.max(floor);
    if value <= 0.0 || !value.is_finite() {
        return floor.max(f64::MIN_POSITIVE);
    }
    let decade = 10f64.powi(value.log10().floor() as i32);
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|top| *top >= value * (1.0 - 1e-9))
        .unwrap_or(10.0 * decade)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0, 1.0), 1.0);
        assert_eq!(nice_ceiling(3.0, 1.0), 5.0);
        assert_eq!(nice_ceiling(20.0, 1.0), 20.0);
        assert_eq!(nice_ceiling(21.0, 1.0), 25.0);
        assert_eq!(nice_ceiling(2001.0, 1.0), 2500.0);
        assert_eq!(nice_ceiling(0.3, 0.01), 0.5);
        assert_eq!(nice_ceiling(0.001, 0.01), 0.01);
    }

    #[test]
    fn paths_break_at_gaps_and_a_lone_point_still_shows() {
        let points = [Some((600.0, 0.0)), Some((300.0, 50.0)), None, Some((2.0, 100.0)), Some((0.0, 200.0))];
        assert_eq!(path(&points, 100.0), "M0.0 100.0L300.0 50.0M598.0 0.0L600.0 0.0");
        assert_eq!(path(&[Some((10.0, 25.0))], 100.0), "M590.0 75.0h1");
        assert_eq!(path(&[None, None], 100.0), "");
        assert_eq!(area(&points[..2], 100.0), "M0.0 100L0.0 100.0L300.0 50.0L300.0 100Z");
    }

    #[test]
    fn a_chart_without_points_says_so_and_keeps_its_frame() {
        let chart = Chart {
            id: "chart-x",
            title: "Waits",
            top: 1.0,
            top_label: "1 s".into(),
            top_is_limit: false,
            area: false,
            lines: vec![Line { class: "s-p50", name: "p50", now: "-".into(), points: vec![None; 3] }],
            notes: vec![("ended", "0".into())],
            empty: "no wait ended",
        };
        let card = chart.card();
        assert!(card.contains("<svg id=\"chart-x\"") && card.contains("class=\"grid base\""), "{card}");
        assert!(card.contains("<span class=\"empty\">no wait ended</span>"));
        assert!(!card.contains("class=\"line"));
        assert!(card.contains("aria-label=\"Waits, last 10 minutes: p50 -\""));
        assert!(card.contains("<li class=\"note\">ended <b>0</b></li>"));
    }
}
