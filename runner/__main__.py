from runner.cli import main

if __name__ == "__main__":  # a spawned process (the transform's pool) imports this module again
    raise SystemExit(main())
