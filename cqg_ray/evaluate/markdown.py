"""Markdown pieces the evaluation reports share: a table, a figure, a judge's verdict."""


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def figure(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def verdict(yes: bool) -> str:
    return "yes" if yes else "**no**"
