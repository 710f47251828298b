use std::time::Instant;
fn main() {
    let shapes = [(1152usize, 896usize), (896, 896), (9728, 896), (896, 4864), (151936, 896)];
    let ws: Vec<Vec<f32>> = shapes.iter().map(|&(o, k)| vec![0.01f32; o * k]).collect();
    for rows in [1usize, 4] {
        let mut line = format!("rows {rows:>2}:");
        for (&(o, k), w) in shapes.iter().zip(&ws) {
            let x = vec![0.5f32; rows * k];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                std::hint::black_box(common::kernel::linear(w, None, &x, rows, k));
                best = best.min(t.elapsed().as_secs_f64());
            }
            line += &format!("  {o}x{k}: {:.0} us ({:.0} GB/s)", best * 1e6, (o * k * 4) as f64 / best / 1e9);
        }
        println!("{line}");
    }
}
