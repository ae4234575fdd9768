package report

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// series is one line of a chart.
type series struct {
	name, color string
	width       float64
	dash        bool // drawn dashed: a bound, not a measurement
	pts         []point
}

// chart is a line chart drawn as inline SVG by svg: no scripts, no fonts or
// styles fetched from anywhere.
type chart struct {
	title, xlabel, ylabel string
	xlog                  bool
	yFixed                bool // use ymin..ymax as given
	ymin, ymax            float64
	legend                bool
	series                []series
}

const (
	chartW, chartH                     = 720, 340
	marginL, marginR, marginT, marginB = 64, 32, 34, 46 // marginR: half a tick label at the right edge
)

// palette holds distinguishable colours (Okabe-Ito, then greys).
var palette = [...]string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000", "#999999", "#666666"}

func color(i int) string { return palette[i%len(palette)] }

func (c *chart) bounds() (x0, x1, y0, y1 float64, ok bool) {
	x0, x1, y0, y1 = math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for _, p := range s.pts {
			if c.xlog && p.X <= 0 {
				continue
			}
			x0, x1 = min(x0, p.X), max(x1, p.X)
			y0, y1 = min(y0, p.Y), max(y1, p.Y)
		}
	}
	if math.IsInf(x0, 0) {
		return 0, 1, 0, 1, false
	}
	if c.yFixed {
		y0, y1 = c.ymin, c.ymax
	} else {
		y0 = min(0, y0)
		if y1 <= y0 {
			y1 = y0 + 1
		}
		y1 *= 1.05
	}
	if c.xlog {
		x0, x1 = math.Pow(10, math.Floor(math.Log10(x0))), math.Pow(10, math.Ceil(math.Log10(x1)))
		if x1 <= x0 {
			x1 = x0 * 10
		}
	} else if x1 <= x0 {
		x1 = x0 + 1
	}
	return x0, x1, y0, y1, true
}

// svg appends the chart to b.
func (c *chart) svg(b *strings.Builder) {
	x0, x1, y0, y1, ok := c.bounds()
	pw, ph := float64(chartW-marginL-marginR), float64(chartH-marginT-marginB)
	sx := func(x float64) float64 {
		if c.xlog {
			return marginL + pw*(math.Log10(x)-math.Log10(x0))/(math.Log10(x1)-math.Log10(x0))
		}
		return marginL + pw*(x-x0)/(x1-x0)
	}
	sy := func(y float64) float64 { return marginT + ph*(1-(y-y0)/(y1-y0)) }
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`+"\n",
		chartW, chartH, chartW, chartH, html.EscapeString(c.title))
	fmt.Fprintf(b, `<text x="%d" y="20" class="title">%s</text>`+"\n", marginL, html.EscapeString(c.title))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" class="frame"/>`+"\n", marginL, marginT, pw, ph)
	if !ok {
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" class="axis">no data</text></svg>`+"\n", marginL+pw/2, marginT+ph/2)
		return
	}
	var xt []float64
	if c.xlog {
		for d := x0; d <= x1*1.0001; d *= 10 {
			xt = append(xt, d)
		}
	} else {
		xt = ticks(x0, x1)
	}
	for _, t := range xt {
		x := sx(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.0f" class="grid"/><text x="%.1f" y="%.0f" class="axis" text-anchor="middle">%s</text>`+"\n",
			x, marginT, x, marginT+ph, x, marginT+ph+16, tickLabel(t))
	}
	for _, t := range ticks(y0, y1) {
		y := sy(t)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" class="grid"/><text x="%d" y="%.1f" class="axis" text-anchor="end">%s</text>`+"\n",
			marginL, y, marginL+pw, y, marginL-6, y+4, tickLabel(t))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%d" class="axis" text-anchor="middle">%s</text>`+"\n", marginL+pw/2, chartH-8, html.EscapeString(c.xlabel))
	fmt.Fprintf(b, `<text x="14" y="%.0f" class="axis" text-anchor="middle" transform="rotate(-90 14 %.0f)">%s</text>`+"\n",
		marginT+ph/2, marginT+ph/2, html.EscapeString(c.ylabel))
	for _, s := range c.series {
		var pts strings.Builder
		for _, p := range s.pts {
			if c.xlog && p.X <= 0 {
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", sx(p.X), sy(min(max(p.Y, y0), y1)))
		}
		w := s.width
		if w == 0 {
			w = 1.8
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(b, `<polyline data-series="%s" fill="none" stroke="%s" stroke-width="%.1f"%s points="%s"/>`+"\n",
			html.EscapeString(s.name), s.color, w, dash, strings.TrimSpace(pts.String()))
	}
	if c.legend {
		for i, s := range c.series {
			y := marginT + 14 + 16*i
			fmt.Fprintf(b, `<rect x="%.0f" y="%d" width="12" height="3" fill="%s"/><text x="%.0f" y="%d" class="legend">%s</text>`+"\n",
				marginL+pw-150, y-4, s.color, marginL+pw-132, y, html.EscapeString(s.name))
		}
	}
	b.WriteString("</svg>\n")
}

// ticks returns about 5 round tick values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

func tickLabel(v float64) string {
	if v != 0 && (math.Abs(v) >= 1e5 || math.Abs(v) < 1e-3) {
		return fmt.Sprintf("%.0e", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}
