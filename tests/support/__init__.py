"""What the test modules share: paths, GPU buffers and random quantized tensors, adapter files, the browser
harness, the random test order. Not a test module: test modules import from here (`from support.gpu import
f32`), never from each other, so any of them runs alone and in any order. tests/conftest.py puts tests/ on
sys.path."""
