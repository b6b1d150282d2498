"""The docs stay true to the code: their tables stay readable, and every command line they (and the CLI's help) give still parses (the
``cqg-ray`` ones by the real CLI parser, the bench/ and scripts/ ones by the files and flags those scripts have)."""

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

from cqg_ray.cli import build_parser

ROOT = Path(__file__).parents[1]
# The pages a user reads: the top level's, docs/ (with the demo's report), and the shipped models' cards and reports,
# which the wheel carries. Not builds/ (records of earlier builds) nor bench/data/ and tests/ (their data).
PAGES = sorted({*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "models").rglob("*.md")})

SEPARATORS = {";", "&&", "||", "|", "&"}
REDIRECT = re.compile(r"^\d*(>>?|<)(\S*)$")  # >, 2>&1, >>log, <in: a bare one's file is the next word
PREFIXES = {"time", "/usr/bin/time", "nohup"}
PLACEHOLDER = re.compile(r"^([A-Z][A-Z0-9_]*|<[^>]+>|\.\.\.)$")  # MODEL, RUN_DIR, B, <new>, ...: a value left to the reader
SCRIPT_PATH = re.compile(r"^(bench|scripts)/[\w.-]+\.(py|sh)$")
STRING_LITERALS = re.compile(r"add_argument\(\s*((?:\"[^\"]*\"|'[^']*')(?:\s*,\s*(?:\"[^\"]*\"|'[^']*'))*)")


def test_no_docs_table_row_over_600_characters():
    long = [f"{p.relative_to(ROOT)}:{i}: {len(line)}" for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for i, line in enumerate(p.read_text().splitlines(), 1) if line.startswith("|") and len(line) > 600]
    assert long == []


def code_texts(path: Path) -> list[tuple[int, str]]:
    """The code of a Markdown page with the line each piece starts on: every line of a fenced block (a line that ends
    in a backslash joined with the next) and every inline code span (one that wraps across lines read as one line)."""
    pieces, prose, fence, pending = [], [], None, None
    for i, line in enumerate(path.read_text().splitlines(), 1):
        marker = re.match(r"\s*(```+|~~~+)", line)
        if fence is None and marker:
            fence, pending = marker.group(1), None
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            fence = None
            prose.append("")
        elif fence is not None:
            start, text = pending or (i, "")
            text += line.strip()
            pending = (start, text[:-1] + " ") if text.endswith("\\") else None
            if pending is None:
                pieces.append((start, text))
            prose.append("")
        else:
            prose.append(line)
    body = "\n".join(prose)
    for m in re.finditer(r"(`+)(.+?)\1", body, re.S):
        pieces.append((body.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split())))
    return sorted(pieces)


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell line as words: split at ; && || | &, comments and redirections dropped, and
    the leading words that only wrap a command (VAR=value, time, /usr/bin/time -v, flock LOCKFILE, a $ prompt) too."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unclosed quote: prose, not a command line
        return []
    commands, current = [], []
    for word in words:
        if word in SEPARATORS or word.endswith(";"):
            if word.endswith(";") and word != ";":
                current.append(word[:-1])
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    out = []
    for command in commands:
        words, target = [], False
        for word in command:
            if target:
                target = False
            elif (m := REDIRECT.match(word)) and not PLACEHOLDER.match(word):  # <new> is a placeholder
                target = not m.group(2)
            else:
                words.append(word)
        while words:
            if words[0] in PREFIXES:
                words = words[1:]
                while words and words[0].startswith("-"):  # its own flags: /usr/bin/time -v
                    words = words[1:]
            elif words[0] == "$" or re.match(r"^[A-Za-z_]\w*=", words[0]):
                words = words[1:]
            elif words[0] == "flock" and len(words) > 2:
                words = words[2:]
            else:
                break
        if words:
            out.append(words)
    return out


def doc_commands() -> list[tuple[str, list[str]]]:
    """Every command line in the docs' code, as ("page:line", words)."""
    return [(f"{page.relative_to(ROOT)}:{line}", words)
            for page in PAGES for line, text in code_texts(page) for words in shell_commands(text)]


def unbracket(words: list[str]) -> list[str]:
    """Words with a usage line's optional brackets taken off its flags: ``[--kind cjk]`` is ``--kind cjk``; a
    bracketed value (``[DIR]``) stays a placeholder."""
    out, open_ = [], False
    for word in words:
        if word.startswith("[-"):
            word, open_ = word[1:], True
        if open_ and word.endswith("]"):
            word, open_ = word[:-1], False
        out.append(word)
    return out


def cli_args(words: list[str]) -> list[str] | None:
    """The arguments of a ``cqg-ray`` command line (``cqg-ray``, ``.venv/bin/cqg-ray`` or ``python -m cqg_ray.cli``),
    else None: also for the tool's bare name in prose (``cqg-ray`` alone) and a path that ends in it
    (``$XDG_CACHE_HOME/cqg-ray``)."""
    if words[0] == "cqg-ray" or words[0].endswith("/bin/cqg-ray"):
        args = words[1:]
    elif Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "cqg_ray.cli"]:
        args = words[3:]
    else:
        return None
    return unbracket(args) or None


def relaxed_parser() -> argparse.ArgumentParser:
    """The CLI parser with every command's positional arguments optional, to check the flags of a line that names a
    command without its arguments (``cqg-ray evaluate --tasks faithfulness`` in prose)."""
    parser = build_parser()
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for command in sub.choices.values():
            for action in command._actions:
                if not action.option_strings and action.required:
                    action.required, action.nargs = False, "*" if action.nargs == "+" else "?"
    return parser


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> tuple[str | None, argparse.Namespace | None]:
    """argparse's message for ``args`` (None if they parse) and the namespace they parse to."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return None, parser.parse_args(args)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1], None


def cli_problem(strict: argparse.ArgumentParser, relaxed: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Why a ``cqg-ray`` line's arguments do not parse, or None if they do. Placeholders (MODEL, DIR, <new>, ...)
    parse as the values they stand for (where a typed flag refuses one, the flag and it are dropped); a trailing
    ``...`` (more arguments, elided) and -h/--help (which prints and exits) are dropped; a line that gives a command
    none of its positional arguments is a mention of that command (``cqg-ray embed``, ``cqg-ray run --help``), and
    only its flags must parse."""
    args = [a for a in args if a not in ("-h", "--help")]
    while args and args[-1] == "..." and not (len(args) > 1 and args[-2].startswith("-")):  # (--tasks ...: a value)
        args = args[:-1]
    if not args:  # cqg-ray --help
        return None
    error, _ = parse_error(strict, args)
    while error and (word := next((w for w in re.findall(r"'([^']*)'", error) if PLACEHOLDER.match(w) and w in args), None)):
        # a placeholder where a typed value goes (--k N): the flag parsed; check the rest without the two
        i = args.index(word)
        args = args[:i - 1] + args[i + 1:] if i and args[i - 1].startswith("-") else args[:i] + args[i + 1:]
        error, _ = parse_error(strict, args)
    if error is None or "the following arguments are required" not in error:
        return error
    relaxed_error, ns = parse_error(relaxed, args)
    if relaxed_error is not None:
        return relaxed_error
    command = next(a for a in relaxed._actions if isinstance(a, argparse._SubParsersAction)).choices[ns.command]
    given = [a.dest for a in command._actions if not a.option_strings and getattr(ns, a.dest, None) not in (None, [])]
    return error if given else None


def cli_problems(commands: list[tuple[str, list[str]]]) -> tuple[int, list[str]]:
    """How many of ``commands`` (where, words) are ``cqg-ray`` lines, and each one's problem ("where: line: why")."""
    strict, relaxed = build_parser(), relaxed_parser()
    lines = [(where, args) for where, words in commands if (args := cli_args(words)) is not None]
    return len(lines), [f"{where}: cqg-ray {shlex.join(args)}: {problem}" for where, args in lines
                        if (problem := cli_problem(strict, relaxed, args))]


def test_every_cqg_ray_line_in_the_docs_parses():
    lines, problems = cli_problems(doc_commands())
    assert lines > 150  # the docs give ~200; far fewer means the collection broke
    assert problems == []


def help_commands() -> list[tuple[str, list[str]]]:
    """Every command line the CLI's own help gives (``cqg-ray X --help``: descriptions, epilogs, option help), as
    ("cqg-ray X --help", words): a code span, or a line's text from ``cqg-ray`` on (its # comment dropped)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, command in [("", parser), *sub.choices.items()]:
        where = f"cqg-ray {name} --help".replace("  ", " ")
        for line in command.format_help().splitlines():
            if line.lstrip().startswith("usage:"):
                continue
            spans = re.findall(r"`([^`]+)`", line)
            texts = spans or [m.group(1) for m in [re.search(r"(?:^|\s)(cqg-ray \S.*)", line)] if m]
            out += [(where, words) for text in texts for words in shell_commands(text) if words]
    return out


def test_every_cqg_ray_line_in_the_clis_help_parses():
    lines, problems = cli_problems(help_commands())
    assert lines > 10  # the help gives ~20; far fewer means the collection broke
    assert problems == []


def script_flags(path: Path) -> set[str] | None:
    """The option strings a script's argparse parsers accept, read from its source (benches run work at import), or
    None if it builds no parser (it reads sys.argv itself)."""
    source = path.read_text()
    if "ArgumentParser(" not in source:
        return None
    literals = [a or b for m in STRING_LITERALS.finditer(source) for a, b in re.findall(r"\"([^\"]*)\"|'([^']*)'", m.group(1))]
    return {s for s in literals if s.startswith("-")} | {"-h", "--help"}


def script_problem(words: list[str]) -> str | None:
    """Why a ``python bench/X.py ...``, ``python scripts/X.py ...`` or ``bash scripts/X.sh ...`` line is wrong (its
    file is missing, or a python script's parser has no such flag), or None. Words after ``--`` belong to the command
    the script runs, and a shell script's are its own business (most pass them on: to pytest, to the demo)."""
    path = ROOT / words[1]
    if not path.is_file():
        return f"no file {words[1]}"
    if words[0] == "bash" or (flags := script_flags(path)) is None:
        return None
    args = unbracket(words[2:words.index("--")] if "--" in words else words[2:])
    unknown = [a for a in args if a.startswith("-") and not re.match(r"^-\d", a) and a.split("=")[0] not in flags]
    return f"{words[1]} has no {', '.join(unknown)} (it has {', '.join(sorted(flags))})" if unknown else None


def test_every_bench_and_script_line_in_the_docs_names_a_file_and_its_flags():
    lines = [(where, words) for where, words in doc_commands()
             if len(words) > 1 and (Path(words[0]).name.startswith("python") or words[0] == "bash")
             and SCRIPT_PATH.match(words[1])]
    problems = [f"{where}: {shlex.join(words)}: {problem}" for where, words in lines if (problem := script_problem(words))]
    assert len(lines) > 50
    assert problems == []


def test_every_bench_and_scripts_file_the_docs_name_exists():
    named = {(where, word) for where, words in doc_commands() for word in words if SCRIPT_PATH.match(word)}
    assert sorted(f"{where}: {word}" for where, word in named if not (ROOT / word).is_file()) == []
