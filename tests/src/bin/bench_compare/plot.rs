//! The comparison's figures: log-log charts of latency and programming time against the
//! number of services.
use std::{fs, path::Path, time::Duration};

use anyhow::{Context as _, ensure};
use socklb_tests::bench::{cluster::Position, peer::Peer};

use crate::step::{Step, median};

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> anyhow::Result<()> {
    let bytes = fs::read(FONT).with_context(|| {
        format!("read the plot font {FONT}: install fonts-dejavu-core (`cargo xtask setup` does)")
    })?;
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        bytes.leak(),
    )
    .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))
}

type Series = (String, plotters::style::RGBColor, Vec<(f64, f64)>);

/// A log-log chart of one value per step and series.
fn plot(path: &Path, title: &str, y_label: &str, series: &[Series]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_font()?;
    let points = series.iter().flat_map(|(_, _, points)| points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for &(x, y) in points {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    ensure!(x_max > 0.0 && y_max > 0.0, "nothing to plot");
    let root = BitMapBackend::new(path, (1000, 650)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_min / 1.5..x_max * 1.5).log_scale(),
            (y_min / 1.5..y_max * 1.5).log_scale(),
        )
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("services (10 endpoints each)")
        .y_desc(y_label)
        .x_labels(12)
        .y_labels(16)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y}"))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| draw(&e))?;
    for (name, color, points) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| draw(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 4, color.filled())),
            )
            .map_err(|e| draw(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))
}

pub fn latency(path: &Path, steps: &[Step]) -> anyhow::Result<()> {
    use plotters::style::{BLACK, BLUE, CYAN, GREEN, MAGENTA, RED, RGBColor};
    let line = |name: &str, color: RGBColor, peer: Peer, position: Position| -> Series {
        let points = steps
            .iter()
            .filter_map(|step| {
                let p50 = step.latency.get(&(peer, position))?.percentile(50);
                Some((f64::from(step.services), p50 as f64 / 1e3))
            })
            .collect();
        (name.to_owned(), color, points)
    };
    plot(
        path,
        "Connection setup to a service, p50 (connect + first bytes + close)",
        "µs",
        &[
            line(
                "direct to the backend (floor)",
                BLACK,
                Peer::Direct,
                Position::Middle,
            ),
            line("socklb, last service", GREEN, Peer::Socklb, Position::Last),
            line(
                "iptables, first service",
                RGBColor(255, 160, 0),
                Peer::Iptables,
                Position::First,
            ),
            line(
                "iptables, middle service",
                MAGENTA,
                Peer::Iptables,
                Position::Middle,
            ),
            line(
                "iptables, last service",
                RED,
                Peer::Iptables,
                Position::Last,
            ),
            line(
                "nftables, last service",
                BLUE,
                Peer::Nftables,
                Position::Last,
            ),
            line(
                "nftables, first service",
                CYAN,
                Peer::Nftables,
                Position::First,
            ),
        ],
    )
}

pub fn control(path: &Path, steps: &[Step]) -> anyhow::Result<()> {
    use plotters::style::{BLUE, CYAN, GREEN, MAGENTA, RED, RGBColor};
    // A load stopped at the limit and a change never measured have no point.
    let line = |name: &str, color: RGBColor, value: &dyn Fn(&Step) -> Duration| -> Series {
        let points = steps
            .iter()
            .filter_map(|step| {
                let value = value(step);
                (!value.is_zero()).then(|| (f64::from(step.services), value.as_secs_f64()))
            })
            .collect();
        (name.to_owned(), color, points)
    };
    // A load stopped at the limit has no time from nothing.
    let from_nothing = |s: &Step, peer: Peer| {
        let control = &s.control[&peer];
        if control.stopped {
            Duration::ZERO
        } else {
            control.program
        }
    };
    plot(
        path,
        "Programming time: every service from nothing, and one endpoint change",
        "seconds",
        &[
            line("iptables-restore, from nothing", RED, &|s| {
                from_nothing(s, Peer::Iptables)
            }),
            line("nft -f, from nothing", BLUE, &|s| {
                from_nothing(s, Peer::Nftables)
            }),
            line("socklb first sync, from nothing", GREEN, &|s| {
                s.control[&Peer::Socklb].program
            }),
            line("iptables one change (full sync)", MAGENTA, &|s| {
                median(&s.control[&Peer::Iptables].change)
            }),
            line(
                "iptables one change (partial sync)",
                RGBColor(255, 160, 0),
                &|s| median(&s.control[&Peer::Iptables].change_partial),
            ),
            line("nftables one change", CYAN, &|s| {
                median(&s.control[&Peer::Nftables].change)
            }),
            line(
                "socklb one change (agent sync)",
                RGBColor(0, 100, 0),
                &|s| median(&s.control[&Peer::Socklb].change),
            ),
        ],
    )
}
