//! The overview's charts of the last hour, drawn here as SVG (no script, no image from
//! elsewhere): full width, a time axis with ticks, each minute's values on hover, and the same
//! values in a table for screen readers and JavaScript-off.

use std::time::{Duration, UNIX_EPOCH};

use maud::{html, Markup};

use crate::rollup::{LastHour, MINUTES};

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 180.0;
/// The plot's box inside the drawing: room on the left for the scale (at least this much,
/// more for a longer top label), below and on the right for the times.
const LEFT: f64 = 48.0;
/// The widest a character of the scale is drawn (13px in console.css, its digits and "ms" at
/// most 0.6 em wide in common sans fonts), with some to spare: the room a label is given.
const SCALE_CHAR_WIDTH: f64 = 8.5;
/// Between the scale's labels and the axis.
const SCALE_GAP: f64 = 6.0;
const RIGHT: f64 = 976.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 150.0;
/// A tick and a time every this many minutes.
const TICK_MINUTES: usize = 10;

/// One series drawn: its name (and CSS class), and one value per minute, oldest first.
struct Series<'a> {
    label: &'a str,
    values: Vec<f64>,
}

/// How a chart's series share a minute.
#[derive(Clone, Copy, PartialEq)]
enum Bars {
    /// On top of each other: counts that add up.
    Stacked,
    /// In front of each other, the first behind: the slowest, then the mean.
    Overlaid,
}

/// `HH:MM` (UTC) of a minute given as Unix seconds / 60.
fn clock(minute: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(minute * 60).unwrap_or(0));
    let text = humantime::format_rfc3339_seconds(at).to_string();
    text[11..16].to_owned()
}

/// The deliveries or attempts of the last hour, a stacked bar per minute.
pub fn counts(hour: &LastHour, labels: &[&str], caption: &str) -> Markup {
    let series: Vec<Series> = hour
        .series
        .iter()
        .filter(|(label, _)| labels.contains(label))
        .map(|(label, counts)| Series {
            label,
            values: counts.iter().map(|&count| count as f64).collect(),
        })
        .collect();
    let totals = series
        .iter()
        .map(|s| format!("{} {}", s.label, s.values.iter().sum::<f64>()))
        .collect::<Vec<_>>()
        .join(", ");
    draw(
        hour.until_minute,
        &series,
        Bars::Stacked,
        &|value| format!("{value}"),
        &format!("{caption} per minute, the last hour: {totals}"),
    )
}

/// One timing of the last hour (`ack`, `run`): per minute the slowest, and its mean in front.
pub fn timing(hour: &LastHour, timing: &str, caption: &str) -> Markup {
    let Some((_, minutes)) = hour.timings.iter().find(|(label, _)| *label == timing) else {
        return html! {};
    };
    let series = [
        Series {
            label: "slowest",
            values: minutes.iter().map(|m| m.max_ms).collect(),
        },
        Series {
            label: "mean",
            values: minutes.iter().map(|m| m.mean_ms).collect(),
        },
    ];
    let timed: u64 = minutes.iter().map(|m| m.count).sum();
    let peak = series[0].values.iter().copied().fold(0.0, f64::max);
    draw(
        hour.until_minute,
        &series,
        Bars::Overlaid,
        &ms,
        &format!(
            "{caption} per minute, the last hour: {timed} timed, the slowest {}",
            ms(peak)
        ),
    )
}

fn ms(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.2} ms")
    } else {
        format!("{value:.0} ms")
    }
}

fn draw(
    until_minute: i64,
    series: &[Series],
    bars: Bars,
    format: &dyn Fn(f64) -> String,
    summary: &str,
) -> Markup {
    let minute_of = |index: usize| until_minute - (MINUTES - 1 - index) as i64;
    let height_of_minute = |index: usize| match bars {
        Bars::Stacked => series.iter().map(|s| s.values[index]).sum::<f64>(),
        Bars::Overlaid => series.iter().map(|s| s.values[index]).fold(0.0, f64::max),
    };
    let peak = (0..MINUTES).map(height_of_minute).fold(0.0, f64::max);
    let scale = if peak > 0.0 {
        (BOTTOM - TOP) / peak
    } else {
        0.0
    };
    // The top label is right-aligned to the axis: the plot starts where it fits in full
    // ("129 ms" in the 48 units once left showed as ".29 ms", cut by the drawing's edge).
    let top_label = format(peak);
    let left = LEFT.max(top_label.chars().count() as f64 * SCALE_CHAR_WIDTH + SCALE_GAP);
    let step = (RIGHT - left) / MINUTES as f64;
    let n = |value: f64| format!("{value:.1}");
    html! {
        figure.chart {
            svg.chart viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(summary) {
                line.axis x1=(n(left)) y1=(n(BOTTOM)) x2=(n(RIGHT)) y2=(n(BOTTOM)) {}
                line.axis x1=(n(left)) y1=(n(TOP)) x2=(n(left)) y2=(n(BOTTOM)) {}
                text.scale x=(n(left - SCALE_GAP)) y=(n(TOP + 10.0)) { (top_label) }
                text.scale x=(n(left - SCALE_GAP)) y=(n(BOTTOM)) { "0" }
                @for index in (0..MINUTES).filter(|i| (MINUTES - 1 - i).is_multiple_of(TICK_MINUTES)) {
                    @let x = left + (index as f64 + 0.5) * step;
                    line.tick x1=(n(x)) y1=(n(BOTTOM)) x2=(n(x)) y2=(n(BOTTOM + 6.0)) {}
                    text.time x=(n(x)) y=(n(BOTTOM + 22.0)) { (clock(minute_of(index))) }
                }
                @for index in 0..MINUTES {
                    @let x = left + index as f64 * step;
                    g {
                        title {
                            (clock(minute_of(index))) " UTC: "
                            @for (at, s) in series.iter().enumerate() {
                                @if at > 0 { ", " }
                                (s.label) " " (format(s.values[index]))
                            }
                        }
                        // The whole column answers the hover, not only its bars.
                        rect.hover x=(n(x)) y=(n(TOP)) width=(n(step)) height=(n(BOTTOM - TOP)) {}
                        @let mut base = BOTTOM;
                        @for s in series {
                            @let h = s.values[index] * scale;
                            @if h > 0.0 {
                                @let y = match bars {
                                    Bars::Stacked => { base -= h; base }
                                    Bars::Overlaid => BOTTOM - h,
                                };
                                rect class=(s.label) x=(n(x + 1.0)) y=(n(y)) width=(n(step - 2.0)) height=(n(h)) {}
                            }
                        }
                    }
                }
            }
            figcaption.key {
                @for s in series {
                    span { svg viewBox="0 0 1 1" { rect class=(s.label) width="1" height="1" {} } (s.label) }
                }
                span.muted { (summary) " (UTC; since this process started)" }
            }
            details.values {
                summary { "The values, minute by minute" }
                table {
                    thead { tr { th { "minute (UTC)" } @for s in series { th.num { (s.label) } } } }
                    tbody {
                        // Newest first; minutes with nothing are left out.
                        @for index in (0..MINUTES).rev().filter(|&i| height_of_minute(i) > 0.0) {
                            tr {
                                td { (clock(minute_of(index))) }
                                @for s in series { td.num { (format(s.values[index])) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollup::{MinuteTiming, MINUTES};

    fn hour() -> LastHour {
        let mut claimed = vec![0; MINUTES];
        claimed[MINUTES - 1] = 7;
        claimed[MINUTES - 3] = 2;
        let mut duplicate = vec![0; MINUTES];
        duplicate[MINUTES - 1] = 3;
        let mut run = vec![MinuteTiming::default(); MINUTES];
        run[MINUTES - 2] = MinuteTiming {
            count: 4,
            mean_ms: 12.0,
            max_ms: 40.0,
        };
        LastHour {
            // 2026-01-01T10:59Z
            until_minute: 1_767_265_140 / 60,
            series: vec![("claimed", claimed), ("duplicate", duplicate)],
            max_skew_secs: vec![0; MINUTES],
            timings: vec![("run", run)],
        }
    }

    #[test]
    fn a_chart_has_a_time_axis_values_on_hover_and_a_table() {
        let page = counts(&hour(), &["claimed", "duplicate"], "Deliveries").into_string();
        // Ticks every ten minutes, the newest minute last.
        for time in ["10:09", "10:19", "10:29", "10:39", "10:49", "10:59"] {
            assert!(page.contains(&format!(">{time}</text>")), "{time}: {page}");
        }
        assert!(page.contains("<title>10:59 UTC: claimed 7, duplicate 3</title>"));
        // The scale's top is the busiest minute's total.
        assert!(page.contains("<text class=\"scale\" x=\"42.0\" y=\"18.0\">10</text>"));
        // The table holds the minutes with something in them, newest first.
        let table = &page[page.find("<table>").unwrap()..];
        let rows: Vec<&str> = table.split("<tr>").skip(2).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(
            rows[0].starts_with("<td>10:59</td><td class=\"num\">7</td><td class=\"num\">3</td>")
        );
        assert!(
            rows[1].starts_with("<td>10:57</td><td class=\"num\">2</td><td class=\"num\">0</td>")
        );
        assert!(page.contains(
            "aria-label=\"Deliveries per minute, the last hour: claimed 9, duplicate 3\""
        ));
    }

    #[test]
    fn a_timing_chart_shows_the_slowest_and_the_mean() {
        let page = timing(&hour(), "run", "Run latency").into_string();
        assert!(
            page.contains("<title>10:58 UTC: slowest 40 ms, mean 12 ms</title>"),
            "{page}"
        );
        assert!(page.contains("4 timed, the slowest 40 ms"));
    }

    /// The top scale label's text and the room it has left of its right edge.
    fn top_scale(page: &str) -> (String, f64) {
        let text = page.split("<text class=\"scale\" x=\"").nth(1).unwrap();
        let x: f64 = text.split('"').next().unwrap().parse().unwrap();
        let label = text.split('>').nth(1).unwrap().split('<').next().unwrap();
        (label.to_owned(), x)
    }

    #[test]
    fn the_scales_top_label_fits_the_drawing_in_full() {
        for (max_ms, shown) in [
            (129.0, "129 ms"),
            (9.87, "9.87 ms"),
            (123_456.0, "123456 ms"),
        ] {
            let mut hour = hour();
            let minute = &mut hour.timings[0].1[MINUTES - 2];
            (minute.max_ms, minute.mean_ms) = (max_ms, max_ms / 2.0);
            let page = timing(&hour, "run", "Run latency").into_string();
            let (label, room) = top_scale(&page);
            assert_eq!(label, shown);
            // Right-aligned at `room`: its characters, each at most 0.6 of the 13px font,
            // must fit between the drawing's edge and there.
            let needed = label.chars().count() as f64 * 13.0 * 0.6;
            assert!(room >= needed, "{label:?} has {room} units, needs {needed}");
        }
    }
}
