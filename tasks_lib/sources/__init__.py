"""Where tasks come from; every source writes its tasks through `authoring.writer.write_task`.

families/     generators, one package per family (demo bug-fix, data analysis, ops)
synthesize/   AST mutants of a real project that its own tests catch reliably
swebench.py   SWE-bench instances with local clones of their repositories
authoring/    the one Harbor task writer, the family scaffold and the task linter
"""
