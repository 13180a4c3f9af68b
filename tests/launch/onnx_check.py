#!/usr/bin/python3
"""ONNX's own checker on Tessera's exports (tests/launch/test_onnx.c).

Usage: onnx_check.py FILE.onnx... Runs onnx.checker.check_model with
full_check (strict shape inference) on each file, checks opset 17, that
every initializer is named like a PyTorch parameter (dotted, ending in
.weight or .bias), and that inferred shapes keep the dynamic dimensions.
Exits 1 on any failure, 2 if onnx cannot be imported (python3-onnx)."""
import sys

try:
    import onnx
except Exception as exc:  # noqa: BLE001 - any import failure fails the test
    print(f"onnx_check: cannot import onnx with {sys.executable}: {exc} (Debian package python3-onnx)")
    sys.exit(2)


def main():
    failed = False
    for path in sys.argv[1:]:
        try:
            m = onnx.load(path)
            onnx.checker.check_model(m, full_check=True)
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
            opset = {o.domain: o.version for o in m.opset_import}[""]
            assert opset == 17, f"opset {opset}"
            bad = [i.name for i in m.graph.initializer if not i.name.endswith((".weight", ".bias"))]
            assert not bad, f"initializers not named like parameters: {bad}"
            dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                    for v in list(inferred.graph.input) + list(inferred.graph.output)]
            assert all(d[0] == "batch" for d in dims), f"no dynamic batch: {dims}"
            print(f"  {path}: ok, opset {opset}, {len(m.graph.node)} nodes, "
                  f"{len(m.graph.initializer)} initializers, inputs/outputs {dims}")
        except Exception as exc:  # noqa: BLE001 - report every file
            print(f"  {path}: FAIL {exc}")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
