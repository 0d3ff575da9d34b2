"""Print the flags sglang-fastverify adds to `python -m sglang.launch_server`, each with its whole
help, read off the patched SGLang's own parser (the list of our flags: fastverify.flags.OUR_FLAGS).

    python scripts/print_flags.py          (scripts/demo.sh runs it; exit 1 if a flag is missing)
"""
import argparse
import sys

from sglang.srt.server_args import ServerArgs

from fastverify import flags

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
print(flags.format_help(parser), end="")
present = {opt for action in flags.our_actions(parser) for opt in action.option_strings}
missing = [opt for opt in flags.OPTIONS if opt not in present]
if missing:
    print(f"error: not among this SGLang's flags (is the series applied?): {', '.join(missing)}",
          file=sys.stderr)
    sys.exit(1)
