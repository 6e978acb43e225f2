## The benchmark history page (benchmarks/tracking/history_report.py fills it). Everything is
## escaped (default filter h); plots are inline SVG: 360 x 150, y from zero.
<%!
W, H, L, R, T, B = 360, 150, 52, 18, 20, 34
def sx(i, n):
    return L + (W - L - R) * (0.5 if n < 2 else i / (n - 1))
def sy(v, top):
    return T + (H - T - B) * (1 - v / top)
def tick(v):
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"
%>
<%def name="plot(p)">\
<% n = len(p.points) %>\
<svg class="plot" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img"><title>${p.title}</title>
<text x="${L}" y="12" class="t">${p.title[:58]} (${p.unit})</text>
% for v in p.ticks:
<line x1="${L}" x2="${W - R}" y1="${'%.1f' % sy(v, p.top)}" y2="${'%.1f' % sy(v, p.top)}" class="g"/><text x="${L - 4}" y="${'%.1f' % (sy(v, p.top) + 3)}" class="y">${tick(v)}</text>
% endfor
% if p.band:
<rect x="${L}" width="${W - L - R}" y="${'%.1f' % sy(p.band[1], p.top)}" height="${'%.1f' % max(0.5, sy(p.band[0], p.top) - sy(p.band[1], p.top))}" class="band"><title>noise band ${'%.4g' % p.band[0]}-${'%.4g' % p.band[1]} ${p.unit}</title></rect>
% endif
% if p.limit is not None:
<line x1="${L}" x2="${W - R}" y1="${'%.1f' % sy(p.limit, p.top)}" y2="${'%.1f' % sy(p.limit, p.top)}" class="lim"><title>limit ${p.limit}</title></line>
% endif
<polyline class="s" points="${' '.join('%.1f,%.1f' % (sx(i, n), sy(q.value, p.top)) for i, q in enumerate(p.points) if q.value is not None)}"/>
% for i, q in enumerate(p.points):
% if q.value is not None:
<circle cx="${'%.1f' % sx(i, n)}" cy="${'%.1f' % sy(q.value, p.top)}" r="${4 if q.injected else 2.5}" class="${'inj' if q.injected else ('bad' if q.bad else 'pt')}"><title>${q.label}: ${'%.4g' % q.value} ${p.unit}${' (slowdown injected)' if q.injected else ''}</title></circle>
% endif
% if n <= 12 or i % ((n + 11) // 12) == 0 or i == n - 1:
<text x="${'%.1f' % sx(i, n)}" y="${H - B + 13}" class="x">${q.label}${'*' if q.injected else ''}</text>
% endif
% endfor
</svg>\
</%def>
<%def name="changes(title, rows, cls)">
<h3 class="${cls}">${title}: ${len(rows)}</h3>
% if rows:
<table><tr><th>benchmark<th>new / old<th>noise band<th>where it began<th>old<th>new</tr>
% for c in rows:
<tr><td>${c["name"]}<td>${'%.3f' % c["ratio"]}<td>${'%.2f-%.2f' % tuple(c["noise_band"]) if c["noise_band"] else "unknown"}<td>${(c["began"]["id"] + " " + c["began"]["commit"] + " " + c["began"]["date"]) if c["began"] else "no step in the history"}<td>${fmt_time(c["old_s"])}<td>${fmt_time(c["new_s"])}</tr>
% endfor
</table>
% endif
</%def>
<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>netcl benchmark history</title>
<style>
body{font-family:sans-serif;margin:1em 2em;max-width:1200px} table{border-collapse:collapse}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee} td:first-child,th:first-child{text-align:left}
.regression{color:#b00} .improvement{color:#070} .fail{background:#fcc} .note{color:#555;font-size:90%}
.plots{display:flex;flex-wrap:wrap;gap:6px} .plot{border:1px solid #ddd}
.plot text{font-size:9px;fill:#333} .plot .t{font-size:10px;font-weight:bold} .plot .y{text-anchor:end}
.plot .x{text-anchor:middle} .g{stroke:#eee} .band{fill:#8ac;opacity:.3} .lim{stroke:#c00;stroke-dasharray:4 3}
.s{fill:none;stroke:#246;stroke-width:1.5} .pt{fill:#246} .bad{fill:#c00} .inj{fill:#fff;stroke:#c00;stroke-width:2}
</style></head><body>
<h1>netcl benchmark history</h1>
<p class="note">Times are each benchmark's fastest round. A change counts only outside its noise
band, from the run-to-run spread of the machine's clean history and the rounds of both runs
(benchmarks/tracking/history_stats.py). Runs marked * had a slowdown injected on purpose
(NETCL_BENCH_SLOWDOWN): they are never part of the noise history.</p>
% for s in sections:
<h2>${s["machine"]}</h2>
<p>${len(s["runs"])} run(s), device class ${s["device"] or "unknown (judged as pocl)"}; latest
${s["latest"].label} at ${s["latest"].date}\
% if s["latest"].injected:
 <b class="regression">with a slowdown injected: ${", ".join(s["latest"].injected)}</b>\
% endif
.</p>
% if s["cmp"]:
<% cmp = s["cmp"] %>
<h3>Summary: ${cmp.new.label} against ${cmp.old.label}</h3>
<p class="note">Noise from ${len(cmp.history)} earlier clean run(s) of this machine
(${", ".join(r.id for r in cmp.history) or "none"})\
% if cmp.machine_spread:
; typical run-to-run spread ${'%.1f' % (cmp.machine_spread * 100)}%\
% endif
% if cmp.paired_spread:
 (${'%.1f' % (cmp.paired_spread * 100)}% for benchmarks paired with their floor, judged against it)\
% endif
.</p>
${changes("Regressions", s["lists"]["regression"], "regression")}
${changes("Improvements", s["lists"]["improvement"], "improvement")}
% if s["lists"]["history too short"]:
<p><b>History too short</b> to know the noise of ${len(s["lists"]["history too short"])} benchmark(s):
fewer than two earlier clean runs of this machine. Run <code>hatch run bench:run</code> again.</p>
% endif
<details><summary>Unchanged (within their noise): ${len(s["lists"]["unchanged"])}</summary>
<table><tr><th>benchmark<th>new / old<th>noise band</tr>
% for c in s["lists"]["unchanged"]:
<tr><td>${c["name"]}<td>${'%.3f' % c["ratio"]}<td>${'%.2f-%.2f' % tuple(c["noise_band"])}</tr>
% endfor
</table></details>
% else:
<p>One run so far: nothing to compare with.</p>
% endif
<h3>Gated figures, as the gate judged them</h3>
<table><tr><th>check<th>limit<th>latest<th>first measured<th>previous<th>verdict</tr>
% for c in checks:
<% f = s["gated_latest"].get(c.name) or {}; prev = s["gated_previous"].get(c.name) or {} %>
<tr class="${'' if f.get('ok', True) else 'fail'}"><td>${c.name}<td>${f.get("limit") or "-"}<td>${fmt(f.get("value"))} ${f.get("unit", "")}<td>${fmt(f.get("first")) if f.get("first") not in (None, f.get("value")) else ""}<td>${fmt(prev.get("value"))}<td>${("ok" if f.get("ok") else "FAIL") if f else "not measured"}${"" if f.get("recorded", True) else " (computed: not judged by the gate)"}</tr>
% endfor
</table>
<p class="note">"first measured": the run's own figure where the gate re-measured a failing check
and judged the re-measured one.</p>
<details open><summary>Gated figures over runs (red dashed: the limit)</summary><div class="plots">
% for p in s["gated_plots"]:
${plot(p)}
% endfor
</div></details>
<details open><summary>Benchmarks over runs (shaded: the noise band around the clean history's level)</summary><div class="plots">
% for p in s["bench_plots"]:
${plot(p)}
% endfor
</div></details>
% endfor
</body></html>
