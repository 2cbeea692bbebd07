"""Draw docs/data-path.svg: the path of one open_by_handle_at through fhmon. Stdlib only."""

from pathlib import Path

W, H = 900, 420
BOXES = [  # x, y, w, h, title, lines
    (30, 40, 250, 150, "virtiofsd (uid 65534)", ["seccomp filter: USER_NOTIF for",
                                                  "name_to_handle_at,", "open_by_handle_at"]),
    (330, 40, 240, 150, "kernel", ["notification queue", "(listener fd)", "ADDFD | SEND"]),
    (620, 40, 250, 330, "fhmon (root)", ["1 RECV, read args (ID_VALID)", "2 verify MAC: key id,",
                                         "  share id, type, bytes", "3 decode on the share's",
                                         "  pinned mount (O_PATH)", "4 inside-the-share check",
                                         "5 reopen with the target's", "  fsuid/fsgid/groups",
                                         "6 inject the fd"]),
    (30, 250, 250, 120, "fhmon launch", ["keeps a listener copy,", "re-registers after a",
                                         "restart"]),
    (330, 250, 240, 120, "key directory",
     ["N keys verify,", "1 signs (HMAC-SHA256,", "128-bit MAC)"]),
]
ARROWS = [((280, 90), (330, 90), "trap"), ((570, 90), (620, 90), "readable"),
          ((620, 160), (570, 160), "ADDFD+SEND"), ((330, 160), (280, 160), "fd"),
          ((155, 250), (155, 190), "filter, fd"), ((570, 310), (620, 310), "keys")]


def svg() -> str:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="13">',
           '<defs><marker id="a" markerWidth="10" markerHeight="7" refX="10" refY="3.5" '
           'orient="auto"><polygon points="0 0, 10 3.5, 0 7"/></marker></defs>',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for x, y, w, h, title, lines in BOXES:
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="#eef3fb" '
                   f'stroke="#335"/>')
        out.append(f'<text x="{x + 10}" y="{y + 20}" font-weight="bold">{title}</text>')
        for i, line in enumerate(lines):
            out.append(f'<text x="{x + 10}" y="{y + 42 + 18 * i}">{line}</text>')
    for (x1, y1), (x2, y2), label in ARROWS:
        out.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#335" '
                   f'marker-end="url(#a)"/>')
        out.append(f'<text x="{(x1 + x2) / 2 - 20}" y="{(y1 + y2) / 2 - 6}" '
                   f'font-size="11">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    target = Path(__file__).with_name("data-path.svg")
    target.write_text(svg())
    print(f"wrote {target}")
