# The two set-up commands (README): `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint typecheck bench install venv clean-demo

venv: $(VENV)/.installed

# torch goes in first and alone: on a host with an NVIDIA driver pip picks its CUDA build; on a
# CPU-only host it must be the CPU build (systemd/torch-spec.sh, which systemd/install.sh uses too;
# SPX_TORCH_SPEC overrides it). DeepSpeed then builds no ops at install time (they JIT on first use)
# and sees the torch already there.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $$(sh systemd/torch-spec.sh)
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation 'deepspeed>=0.14'
	$(BIN)/pip install -q -e '.[train,test]'
	touch $@

demo: venv
	$(BIN)/python examples/demo.py

test: venv
	bash tests/system-deps.sh
	bash tests/run.sh

test-fast: venv
	bash tests/run.sh -m "not slow and not systemd"

lint: venv
	$(BIN)/ruff check .
	$(MAKE) typecheck

# mypy checks the daemon as it is imported (spx.daemon): the editable install's import hook is
# invisible to mypy, so a tree of links under build/ gives it the package, and every import across
# modules is checked (a module that moved is an error, never a silent Any).
typecheck: venv
	mkdir -p build/mypy/spx
	ln -sfn $(CURDIR)/daemon build/mypy/spx/daemon
	ln -sfn $(CURDIR)/trainer build/mypy/spx/trainer
	MYPYPATH=build/mypy $(BIN)/mypy -p spx.daemon

# make bench [BENCH_ARGS="--quick --only goodput"]: every bench/bench_*.py, then one table (bench/run_all.py).
bench: venv
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

# sudo make install [DESTDIR=DIR] [INSTALL_ARGS="--venv DIR --prefix DIR --torch SPEC"]: see docs/systemd.md.
install:
	bash systemd/install.sh $(INSTALL_ARGS)

clean-demo:
	rm -rf .demo
