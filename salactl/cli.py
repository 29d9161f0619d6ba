"""The `salactl` Typer app: one module per subcommand, known errors as one line + exit code."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

_INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_at_startup(signum, frame) -> None:
    """An interrupt while this module loads (typer, rich): nothing to clean up yet, so the one line
    and the exit code main() gives, without the traceback an import-time KeyboardInterrupt prints."""
    print("terminated" if signum == signal.SIGTERM else "interrupted", file=sys.stderr)
    os._exit(128 + signum)


def _is_the_command() -> bool:
    """This process is the salactl command (console script, `python -m salactl`), not a host that
    imports the app (a test runner, a notebook), whose own signal handling stays untouched."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return ((Path(argv0).stem == "salactl" or Path(argv0).name == "__main__.py")
            and threading.current_thread() is threading.main_thread())


def _handle(handler) -> dict:
    """Install `handler` for SIGINT and SIGTERM, except where they are ignored (`trap '' INT`, a
    background job of a script): an ignored Ctrl-C stays ignored. Returns what was there before."""
    return {sig: signal.signal(sig, handler) for sig in _INTERRUPT_SIGNALS
            if signal.getsignal(sig) is not signal.SIG_IGN}


def _restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


_handlers_before_import = _handle(_exit_at_startup) if _is_the_command() else {}
try:
    import codecs  # noqa: E402 - the imports that take a while come after the startup handlers
    import errno  # noqa: E402
    import time  # noqa: E402
    import traceback  # noqa: E402
    import warnings  # noqa: E402

    import typer  # noqa: E402

    from salactl.errors import CapacityError, ModelLimitWarning, SalactlError  # noqa: E402
except BaseException:
    _restore(_handlers_before_import)
    raise

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
    help="Quantize, run, profile and benchmark MiniCPM-SALA-class hybrid LLMs.",
)


def _print_version(value: bool) -> None:
    if value:
        from salactl import __version__

        print(f"salactl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print salactl's version and exit.")) -> None:
    pass


def _register() -> None:
    from salactl import cmd_bench, cmd_eval, cmd_info, cmd_profile, cmd_quantize, cmd_report, cmd_run, cmd_sweep

    for module in (cmd_run, cmd_info, cmd_eval, cmd_quantize, cmd_bench, cmd_sweep, cmd_profile, cmd_report):
        module.register(app)


try:
    _register()
finally:
    _restore(_handlers_before_import)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that the cleanup Ctrl-C gets (temp outputs removed,
    run summaries marked interrupted) runs for it too."""


def _interrupted() -> None:
    """Exit 130 for Ctrl-C, 143 (128 + SIGTERM) for a termination request, once the cleanup the
    interrupt ran through is done. A worker thread still inside a long torch op (bench's engine
    thread mid-prefill) would abort the interpreter's teardown (exit 134), so the process then ends
    at once."""
    terminated = _terminated[0]
    code = 143 if terminated else 130
    print("terminated" if terminated else "interrupted", file=sys.stderr)
    if any(t.is_alive() and t is not threading.main_thread() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, SalactlError):     # SalactlError: streams.StdoutWriteError
                pass
        os._exit(code)
    sys.exit(code)


_terminated = [False]
_redelivery_pending = [False]


def _on_interrupt(signum, frame) -> None:
    """Ctrl-C raises KeyboardInterrupt and SIGTERM Terminated, except while torch is being
    imported: its C initialisation swallows an exception raised inside it (the command then runs on,
    with numpy half loaded) or aborts (exit 134), so the signal waits until the import is done."""
    if _importing_torch():
        if not _redelivery_pending[0]:
            _redelivery_pending[0] = True
            threading.Thread(target=_redeliver_after_torch_import, args=(signum,), daemon=True).start()
        return
    if signum == signal.SIGTERM:
        _terminated[0] = True
        raise Terminated()
    raise KeyboardInterrupt


def _install_interrupt_handlers() -> tuple[dict, object]:
    """_on_interrupt for SIGINT/SIGTERM, and an unraisable hook that delivers again an interrupt
    raised where Python cannot propagate it (a weakref callback such as importlib's module-lock
    cleanup, a __del__): Python prints it as "Exception ignored" and runs on, so a SIGTERM arriving
    there was lost and the command went on to its end. Returns what _restore_interrupt_handlers puts back."""
    before = _handle(_on_interrupt), sys.unraisablehook
    sys.unraisablehook = _redeliver_swallowed_interrupts(sys.unraisablehook)
    return before


def _restore_interrupt_handlers(before: tuple[dict, object]) -> None:
    _restore(before[0])
    sys.unraisablehook = before[1]


def _redeliver_swallowed_interrupts(previous):
    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):     # Terminated is one
            previous(unraisable)
            return
        import _thread

        # from another thread, a moment later: delivered now, it would be raised inside this hook
        # (or the callback still running) and swallowed again
        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        threading.Timer(0.01, _thread.interrupt_main, args=(signum,)).start()
    return hook


# MemoryErrors Python could not raise (a generator or __del__ finalized while failed work still held
# its memory, as the frames of a MemoryError unwind): held back until main ends, where they are
# reported, or dropped ("drop") once the command ends in the one-line out-of-memory error, which
# they would otherwise precede as "Exception ignored in ..." tracebacks
_memory_errors: dict = {"held": [], "drop": False}


def _holding_memory_errors(previous):
    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, MemoryError):
            previous(unraisable)
        elif not _memory_errors["drop"]:
            _memory_errors["held"].append(unraisable)
    return hook


def _importing_torch() -> bool:
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))      # set by importlib while the module executes


def _redeliver_after_torch_import(signum: int) -> None:
    import _thread

    while _importing_torch():
        time.sleep(0.01)
    _redelivery_pending[0] = False
    _thread.interrupt_main(signum)


def _streams_that_cannot_fail_to_encode() -> None:
    """stdout and stderr written to a file or pipe in an encoding other than UTF-8 (Windows'
    cp1252) are switched to UTF-8, so that generated text and the tables' labels (∞, ‖, −) arrive
    whole; a terminal keeps its encoding and shows what it cannot as '?' instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream.isatty():
                if stream.errors == "strict":
                    stream.reconfigure(errors="replace")
            elif codecs.lookup(stream.encoding).name != "utf-8":
                stream.reconfigure(encoding="utf-8", errors=stream.errors)
        except (AttributeError, LookupError, OSError, TypeError, ValueError):   # None under pythonw, a stand-in
            pass


def _closed_streams_to_devnull() -> bool:
    """A stdout or stderr closed before the start (`salactl ... >&-`; pythonw has none) is None in
    Python: /dev/null takes its place (and its file descriptor), instead of a traceback at the first
    write. Returns whether stdout was closed, which streams.ClosedStdout then reports."""
    stdout_closed = sys.stdout is None
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
    return stdout_closed


def _exit_after_main(signum, frame) -> None:
    """An interrupt once main() is done: its results are complete, so the process ends at once,
    quietly, with the signal's status. Raising then would land in the interpreter's teardown (torch's
    atexit finalizers), which prints a traceback and exits 0."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:           # a closed or failing stream: nothing more can reach it
            pass
    os._exit(128 + signum)


def main() -> None:
    on_main_thread = threading.current_thread() is threading.main_thread()
    # the console script and `python -m salactl` end right after main(); a host that calls it (a
    # test runner) runs on, with its own handlers back
    ends_the_process = _is_the_command() and sys._getframe(1).f_globals.get("__name__") == "__main__"
    before = _install_interrupt_handlers() if on_main_thread else None
    unraisable_hook = sys.unraisablehook
    _memory_errors.update(held=[], drop=False)
    sys.unraisablehook = _holding_memory_errors(unraisable_hook)
    try:
        _main()
    finally:
        sys.unraisablehook = unraisable_hook
        for unraisable in _memory_errors["held"]:
            unraisable_hook(unraisable)
        _memory_errors.update(held=[], drop=False)
        if ends_the_process and on_main_thread:
            _handle(_exit_after_main)
        elif before is not None:
            _restore_interrupt_handlers(before)


def _main() -> None:
    stdout_closed = _closed_streams_to_devnull()
    from salactl import streams
    from salactl.bench.out_of_memory import is_out_of_memory     # now: importing it out of memory could fail

    _streams_that_cannot_fail_to_encode()
    streams.check_stdout_writes()
    streams.stderr_best_effort()
    if stdout_closed:
        sys.stdout = streams.ClosedStdout(sys.stdout)
    out_of_memory = None
    try:
        with warnings.catch_warnings():
            # the commands say the same with the flag to change (output.warn_past_trained_length)
            warnings.simplefilter("ignore", ModelLimitWarning)
            rv = app(standalone_mode=False)
            sys.stdout.flush()      # a closed pipe shows here, not in the interpreter's last flush
            if stdout_closed:
                sys.stdout.raise_if_dropped()
        # typer >= 0.16 turns Ctrl-C into Exit(130) and, without standalone mode, returns the code
        if isinstance(rv, int) and not isinstance(rv, bool) and rv:
            if rv == 130:
                _interrupted()
            sys.exit(rv)
    except SalactlError as e:
        if os.environ.get("SALACTL_DEBUG") == "1":
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        if isinstance(e, streams.StdoutWriteError):
            _stdout_to_devnull()        # what is still buffered for it goes nowhere, not into a second error
        sys.exit(e.exit_code)
    except BrokenPipeError:
        _closed_pipe()
    except SystemExit as e:         # click turns a write to a closed pipe into a silent exit 1
        if isinstance(e.__context__, OSError) and e.__context__.errno == errno.EPIPE:
            _closed_pipe()
        raise
    except OSError as e:            # an I/O failure no check foresaw (disk full, a path gone)
        if os.environ.get("SALACTL_DEBUG") == "1":
            raise
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"error: {e.strerror or e}{where}; SALACTL_DEBUG=1 shows where", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        _interrupted()
    except typer.Exit as e:
        if e.exit_code == 130:
            _interrupted()
        sys.exit(e.exit_code)
    except (typer.Abort,):
        _interrupted()
    except (MemoryError, RuntimeError) as e:     # after typer.Exit and Abort: click's are RuntimeErrors
        if not is_out_of_memory(e):
            raise
        if os.environ.get("SALACTL_DEBUG") == "1":
            traceback.print_exc()
        _memory_errors.update(held=[], drop=True)     # what they held (frames) is freed with them
        out_of_memory = _out_of_memory_line(e)
    except Exception as e:  # click usage errors (unknown option, bad value) arrive here
        if isinstance(e, _no_args_is_help()):    # bare `salactl`, `salactl eval`: the help, no error
            print(e.format_message(), file=sys.stderr)
            sys.exit(e.exit_code)
        if isinstance(e, _click_errors()):
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            print(f"error: {e.format_message()}{hint}", file=sys.stderr)
            sys.exit(e.exit_code)
        raise
    if out_of_memory is not None:
        # out of the except clause: what the failed work held (the traceback's frames) is freed
        print(out_of_memory, file=sys.stderr)
        sys.exit(CapacityError.exit_code)


def _out_of_memory_line(e: BaseException) -> str:
    """What an allocation failure no command foresaw says (the writers are atomic: no partial output)."""
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "salactl")
    detail = str(e).splitlines()[0] if str(e) else ""
    why = f"{type(e).__name__}: {detail}" if detail else type(e).__name__
    return (f"error: {command} ran out of host or GPU memory ({why}); free memory or use smaller sizes "
            f"(fewer or shorter inputs, smaller batches or chunks); SALACTL_DEBUG=1 shows where")


def _closed_pipe() -> None:
    """stdout's reader went away (`salactl ... | head -1`): exit 141 in silence, as SIGPIPE ends a C
    tool, with stdout on /dev/null so that the interpreter's last flush has nowhere to fail."""
    _stdout_to_devnull()
    sys.exit(128 + getattr(signal, "SIGPIPE", 13))    # Windows has no SIGPIPE


def _stdout_to_devnull() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):    # a stdout without a file descriptor (tests)
        pass


def _click_errors() -> tuple[type, ...]:
    """click's exception base: recent typer vendors click as typer._click; older typer imports click."""
    return _click_exceptions("ClickException")


def _no_args_is_help() -> tuple[type, ...]:
    return _click_exceptions("NoArgsIsHelpError")


def _click_exceptions(name: str) -> tuple[type, ...]:
    types = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            types.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(types)
