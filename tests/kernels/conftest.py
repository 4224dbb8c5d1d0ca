import os
import sys

# the shared helpers (kernels_testutil, embedding_testutil) for the family subfolders' tests
sys.path.insert(0, os.path.dirname(__file__))
